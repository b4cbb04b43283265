"""Tests of meta/lv3/data_parallel/ (tests/lv3/ mirrors the wings of Level 3)."""
