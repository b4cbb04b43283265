"""Tests of meta/lv3/hybrid/ (tests/lv3/ mirrors the wings of Level 3)."""
