"""Timing: warm-up, fresh state per measurement, variants taking turns."""

from __future__ import annotations

import pytest

from meta.bench.measure import Variant, measure, measure_many


def test_setup_runs_before_every_call_and_warmup_is_not_recorded():
    calls: list[str] = []
    counter = {"setup": 0}

    def setup() -> tuple:
        counter["setup"] += 1
        return ({"fresh": counter["setup"]},)

    def run(state: dict) -> None:
        calls.append(f"run {state['fresh']}")

    sample = measure(run, repeat=4, warmup=2, setup=setup)
    assert len(sample.times_ns) == 4 and all(t >= 0 for t in sample.times_ns)
    assert counter["setup"] == 6 and calls == [f"run {i}" for i in range(1, 7)]
    assert sample.summary().n == 4


def test_variants_take_turns():
    order: list[str] = []
    samples = measure_many({"a": Variant(lambda: order.append("a")),
                            "b": Variant(lambda: order.append("b"))}, repeat=3, warmup=1)
    assert order == ["a", "b"] * 4
    assert {k: len(s.times_ns) for k, s in samples.items()} == {"a": 3, "b": 3}


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="repeat >= 1"):
        measure(lambda: None, repeat=0)
