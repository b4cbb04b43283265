"""Pipeline schedules, and a model of the step they make (its time and its bubble).

A schedule is, for one stage, the order of its work on ``m`` micro-batches: ``("F", i)`` runs
micro-batch ``i`` forward, ``("B", i)`` backward. Two are built in:

* ``gpipe`` (GPipe's fill-drain): all forwards, then all backwards (last micro-batch first). A
  stage keeps the activations of all ``m`` micro-batches until its backwards start.
* ``1f1b`` (PipeDream-Flush, Megatron's non-interleaved schedule): stage ``s`` of ``p`` runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one backward, then
  drains. It keeps at most ``p - s`` micro-batches in flight, whatever ``m`` is.

Both flush at the end of the step (every gradient is of the same weights), and with equal
stage times both idle a share ``(p - 1) / (m + p - 1)`` of every stage's time: the bubble.
``simulate`` plays a schedule with given per-stage times and message costs (an α-β link) and
returns the step time and each stage's idle share, the cost model of a pipelined step.

>>> gpipe(3)
[('F', 0), ('F', 1), ('F', 2), ('B', 2), ('B', 1), ('B', 0)]
>>> one_f_one_b(0, 2, 3)
[('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
>>> round(simulate([gpipe(4)] * 2, [1, 1], [2, 2]).bubble, 4), round(1 / (4 + 1), 4)
(0.2, 0.2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

Op = tuple[str, int]  # ("F" or "B", micro-batch index)
SCHEDULES = ("gpipe", "1f1b")


def gpipe(m: int) -> list[Op]:
    """Fill-drain: ``m`` forwards, then ``m`` backwards in reverse (the same on every stage)."""
    return [("F", i) for i in range(m)] + [("B", i) for i in reversed(range(m))]


def one_f_one_b(stage: int, stages: int, m: int) -> list[Op]:
    """One-forward-one-backward for ``stage`` of ``stages`` over ``m`` micro-batches."""
    warmup = min(stages - stage - 1, m)
    ops: list[Op] = [("F", i) for i in range(warmup)]
    for j in range(m - warmup):
        ops += [("F", warmup + j), ("B", j)]
    return ops + [("B", j) for j in range(m - warmup, m)]


def schedule(name: str, stage: int, stages: int, m: int, backward: bool = True) -> list[Op]:
    """Stage ``stage``'s work under schedule ``name``; forward only (inference) when
    ``backward`` is False."""
    if not backward:
        return [("F", i) for i in range(m)]
    if name == "gpipe":
        return gpipe(m)
    if name == "1f1b":
        return one_f_one_b(stage, stages, m)
    raise ValueError(f"unknown pipeline schedule {name!r}; expected one of {SCHEDULES}")


def in_flight(ops: Sequence[Op]) -> int:
    """The most micro-batches whose activations a stage holds at once under ``ops``."""
    live = peak = 0
    for kind, _ in ops:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def bubble_estimate(stages: int, m: int) -> float:
    """GPipe's idle share of a stage with equal stage times: (p - 1) / (m + p - 1)."""
    return (stages - 1) / (m + stages - 1)


@dataclass
class Simulated:
    """A modelled step: its time, and per stage the busy time, when it finished and its idle
    share of the step (``bubble`` is their mean)."""

    step_s: float
    """The modelled step's time, seconds."""
    busy_s: list[float]
    """Per stage: seconds it computed during the step."""
    finish_s: list[float]
    """Per stage: when it finished its last operation."""

    @property
    def idle(self) -> list[float]:
        return [1.0 - b / self.step_s if self.step_s > 0 else 0.0 for b in self.busy_s]

    @property
    def bubble(self) -> float:
        return sum(self.idle) / len(self.idle)


def simulate(schedules: Sequence[Sequence[Op]], forward_s: Sequence[float],
             backward_s: Sequence[float], activation_s: Sequence[float] = (),
             gradient_s: Sequence[float] = (), cores: int | None = None) -> Simulated:
    """Play ``schedules`` (one per stage), each operation as soon as its inputs have arrived.

    ``forward_s[s]``/``backward_s[s]``: stage ``s``'s time for one micro-batch;
    ``activation_s[s]``: the message from stage ``s`` to ``s + 1`` (default free),
    ``gradient_s[s]``: the message back from ``s + 1`` to ``s``. A forward waits for the
    previous stage's forward of its micro-batch, a backward for the next stage's backward (the
    last stage: for its own forward); a stage does its operations in order. With ``cores``
    (fewer than the stages: ranks oversubscribing a machine) at most that many operations run
    at once, the one that can start first taking the next free core. Raises ValueError when
    the schedules wait on each other forever.
    """
    p = len(schedules)
    act = list(activation_s) or [0.0] * max(p - 1, 0)
    grad = list(gradient_s) or [0.0] * max(p - 1, 0)
    done: dict[tuple[str, int, int], float] = {}
    free, busy, pos = [0.0] * p, [0.0] * p, [0] * p
    core_free = [0.0] * cores if cores else []
    while any(pos[s] < len(schedules[s]) for s in range(p)):
        ready = []  # (earliest start, stage, cost) of every stage whose next op can run
        for s in range(p):
            if pos[s] == len(schedules[s]):
                continue
            kind, i = schedules[s][pos[s]]
            if kind == "F":
                dep, delay = (("F", s - 1, i), act[s - 1]) if s > 0 else (None, 0.0)
            else:
                dep, delay = (("B", s + 1, i), grad[s]) if s < p - 1 else (("F", s, i), 0.0)
            if dep is None or dep in done:
                arrival = done[dep] + delay if dep is not None else 0.0
                cost = forward_s[s] if kind == "F" else backward_s[s]
                ready.append((max(free[s], arrival), s, cost))
        if not ready:
            stuck = {s: schedules[s][pos[s]] for s in range(p) if pos[s] < len(schedules[s])}
            raise ValueError(f"pipeline schedules deadlock: stages wait at {stuck}")
        start, s, cost = min(ready)
        if core_free:
            core = min(range(len(core_free)), key=core_free.__getitem__)
            start = max(start, core_free[core])
            core_free[core] = start + cost
        kind, i = schedules[s][pos[s]]
        done[kind, s, i] = free[s] = start + cost
        busy[s] += cost
        pos[s] += 1
    return Simulated(max(free, default=0.0), busy, free)
