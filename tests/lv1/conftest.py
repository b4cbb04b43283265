"""Fixtures of the level-1 tests."""

from __future__ import annotations

import pytest

from meta.lv1.plan import precision


@pytest.fixture
def native(monkeypatch):
    """A CPU that multiplies bf16 natively, with the switch that simulates one without it
    (``META_NO_NATIVE_BF16``) cleared; elsewhere the test skips (a bf16 plan would run
    float32 and prove nothing about bf16)."""
    monkeypatch.delenv(precision.SIMULATE_ENV, raising=False)
    if not precision.native_bf16()[0]:
        pytest.skip("this CPU has no native bf16: precision=bf16 runs float32")
