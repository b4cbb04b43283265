"""Tests of meta/lv3/sandblaster/ (tests/lv3/ mirrors the wings of Level 3)."""
