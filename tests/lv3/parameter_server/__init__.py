"""Tests of meta/lv3/parameter_server/ (tests/lv3/ mirrors the wings of Level 3)."""
