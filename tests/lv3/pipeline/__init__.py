"""Tests of meta/lv3/pipeline/ (tests/lv3/ mirrors the wings of Level 3)."""
