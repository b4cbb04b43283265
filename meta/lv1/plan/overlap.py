"""Overlapping a plan's nonblocking collectives with the work that does not need them.

A communicating operator's lowering (tensor parallelism's ``CopyToParallel`` backward, its
``AllReduceSum``: ``meta.lv3.tensor_parallel.lowering``) may split a collective into two steps,
added one after the other: a ``Start`` (the buffer handed to MPI, ``Iallreduce``) and a
``Wait`` (the buffer whole again). ``schedule``, run by the compiler before memory is laid out,
then moves between them every step of the same phase, since the last collective before, that
the start does not depend on: in a tensor-parallel backward, the weight-gradient products of the
layers computed since the last collective run while the input gradient of a column-parallel
layer is summed over the ranks (Megatron-LM overlaps the same pair). Each moved step is
followed by a progress step (``Start.progress``): MPI without a progress thread (MPICH's
default) moves a nonblocking collective only inside the calls that test it, so without them the
whole transfer would still happen in the wait (a 1 MB allreduce of 2 ranks waited 0.43 ms
after 4 products left untested, 0.01 ms with a test after each).

Dependencies are the steps' declared reads and writes, by the bytes they name (a view is its
base's bytes), and the order of one node's own steps (a kernel may keep state between them).
The steps moved keep their order; every step that the start needs stays before it, so the
reordered plan computes what the plan as written computes. Collectives keep their order
(a ``Start`` or ``Wait`` is never moved, and no step is moved across an earlier collective's),
and every rank compiles the same plan, so the ranks still meet in the same collectives.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from meta.lv1.plan.builder import Lookup, PlanBuilder, PlannedStep
from meta.lv1.plan.memory import Value, root


@dataclass
class Start(PlannedStep):
    """A step that starts a nonblocking collective; ``progress`` builds a step that advances
    it (tests it), placed after each step the scheduler moves between it and its ``Wait``."""

    progress: Callable[[Lookup], list] | None = None


@dataclass
class Wait(PlannedStep):
    """The step that completes the collective the ``Start`` before it started."""


def add_pair(pb: PlanBuilder, name: str, buffer: str, start: Callable[[Lookup], list],
             wait: Callable[[Lookup], list], progress: Callable[[Lookup], list] | None,
             phase: str, into: str = "") -> None:
    """Add a ``Start`` and its ``Wait`` on ``buffer`` (each reads and writes it: MPI owns its
    bytes from one to the other) to ``pb``, as ``pb.step`` adds a step; with ``into``, a
    collective from ``buffer`` into another value (a reduce-scatter), which both also
    write."""
    touched = [buffer, into] if into else [buffer]
    for kind, build in ((Start, start), (Wait, wait)):
        pb.step(f"{name} {'start' if kind is Start else 'wait'}", touched, touched, build,
                phase)
        made = pb.steps[-1]
        extra = {"progress": progress} if kind is Start else {}
        pb.steps[-1] = kind(**{f.name: getattr(made, f.name) for f in fields(made)}, **extra)


def schedule(steps: list[PlannedStep], values: dict[str, Value]) -> list[PlannedStep]:
    """``steps`` with each phase's independent steps moved between a ``Start`` and its
    ``Wait`` (the module docstring); the phases in the order given."""
    if not any(isinstance(s, Start) for s in steps):
        return steps
    out: list[PlannedStep] = []
    for phase in dict.fromkeys(s.phase for s in steps):
        out += _phase([s for s in steps if s.phase == phase], values)
    return out


def _phase(steps: list[PlannedStep], values: dict[str, Value]) -> list[PlannedStep]:
    out: list[PlannedStep] = []
    window: list[PlannedStep] = []  # since the last collective step
    for step in steps:
        if isinstance(step, Start):
            kept, moved = _split(window, step, values)
            out += kept
            out.append(step)
            for m in moved:
                out.append(m)
                if step.progress is not None:
                    out.append(PlannedStep(f"{step.name.removesuffix(' start')} progress",
                                           step.phase, (), (),
                                           step.progress, step.node, step.op_type))
            window = []
        elif isinstance(step, Wait):
            out += window
            out.append(step)
            window = []
        else:
            window.append(step)
    return out + window


def _split(window: list[PlannedStep], start: Start, values: dict[str, Value]
           ) -> tuple[list[PlannedStep], list[PlannedStep]]:
    """(the steps ``start`` depends on, directly or through another, in order; the rest)."""
    def bytes_of(names: tuple[str, ...]) -> set[str]:
        return {root(values, n) for n in names if n in values}

    reads, writes = bytes_of(start.reads), bytes_of(start.writes)
    nodes = {start.node}
    kept: list[PlannedStep] = []
    moved: list[PlannedStep] = []
    for step in reversed(window):
        r, w = bytes_of(step.reads), bytes_of(step.writes)
        if w & (reads | writes) or r & writes or (step.node and step.node in nodes):
            kept.append(step)
            reads |= r
            writes |= w
            nodes.add(step.node)
        else:
            moved.append(step)
    return kept[::-1], moved[::-1]
