"""Tests of meta/lv3/comm/ (tests/lv3/ mirrors the wings of Level 3)."""
