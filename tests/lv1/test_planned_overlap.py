"""The plan's scheduler of nonblocking collectives (``meta.lv1.plan.overlap``): the steps a
``Start`` does not depend on move between it and its ``Wait``, each followed by a progress step;
everything it depends on (through reads, writes, views and a node's own earlier steps) stays
before it, in order."""

from __future__ import annotations

import numpy as np

from meta.lv1.plan.builder import PlannedStep
from meta.lv1.plan.memory import Value
from meta.lv1.plan.overlap import Start, Wait, schedule


def _step(name: str, reads=(), writes=(), node: str = "", kind=PlannedStep, **extra):
    return kind(name, "backward", tuple(reads), tuple(writes), lambda a: [], node or name,
                **extra)


def _values(*names: str, views: dict[str, str] | None = None) -> dict[str, Value]:
    values = {n: Value(n, (4,), np.dtype(np.float32)) for n in names}
    for name, base in (views or {}).items():
        values[name] = Value(name, (4,), np.dtype(np.float32), storage="view", base=base)
    return values


def test_independent_steps_move_between_start_and_wait_with_progress_after_each() -> None:
    progress = lambda a: []  # noqa: E731
    steps = [
        _step("dX fc", ["dy", "w"], ["g"], node="fc"),
        _step("dW fc", ["x", "dy"], ["dw"], node="fc"),
        _step("dW proj", ["h", "dz"], ["dw2"], node="proj"),
        _step("sum start", ["g"], ["g"], node="copy", kind=Start, progress=progress),
        _step("sum wait", ["g"], ["g"], node="copy", kind=Wait),
        _step("LN backward", ["g"], ["dx"], node="ln"),
    ]
    out = schedule(steps, _values("dy", "w", "g", "x", "dw", "h", "dz", "dw2", "dx"))
    assert [s.name for s in out] == [
        "dX fc", "sum start", "dW fc", "sum progress", "dW proj", "sum progress", "sum wait",
        "LN backward"]
    assert out[3].build is progress


def test_what_the_start_needs_stays_before_it() -> None:
    steps = [
        _step("a", [], ["t"]),  # read by b, which writes the buffer: needed
        _step("c", ["u"], ["v"]),  # independent: moves
        _step("b", ["t"], ["g"]),
        _step("d", ["g"], ["w"]),  # reads the buffer before MPI owns it: stays before
        _step("e", [], ["view"]),  # writes the buffer's bytes through a view: stays
        _step("s", ["g"], ["g"], kind=Start),
        _step("wait", ["g"], ["g"], kind=Wait),
    ]
    out = schedule(steps, _values("t", "u", "v", "g", "w", views={"view": "g"}))
    assert [s.name for s in out] == ["a", "b", "d", "e", "s", "c", "wait"]


def test_a_nodes_earlier_steps_stay_with_a_later_one_that_stays() -> None:
    steps = [
        _step("scratch", [], ["private"], node="attention"),  # state a later step reads
        _step("dX", ["dy"], ["g"], node="attention"),
        _step("s", ["g"], ["g"], node="copy", kind=Start),
        _step("wait", ["g"], ["g"], node="copy", kind=Wait),
    ]
    out = schedule(steps, _values("private", "dy", "g"))
    assert [s.name for s in out] == ["scratch", "dX", "s", "wait"]


def test_nothing_moves_across_an_earlier_collective_or_without_a_start() -> None:
    steps = [
        _step("early", [], ["a"]),
        _step("s1", ["g1"], ["g1"], kind=Start),
        _step("w1", ["g1"], ["g1"], kind=Wait),
        _step("late", [], ["b"]),
        _step("s2", ["g2"], ["g2"], kind=Start),
        _step("w2", ["g2"], ["g2"], kind=Wait),
    ]
    values = _values("a", "b", "g1", "g2")
    assert [s.name for s in schedule(steps, values)] == \
        ["s1", "early", "w1", "s2", "late", "w2"]
    plain = [_step("x", [], ["a"]), _step("y", ["a"], ["b"])]
    assert schedule(plain, values) is plain
