"""Per-step phase timings of a distributed optimizer, as a summary and a Chrome trace.

A strategy calls ``begin()`` when its ``step`` starts (the time since the previous step ended is
recorded as ``compute``: forward, backward and data loading) and ``lap(phase)`` after each phase.
``chrome_trace`` gathers every rank's events into one JSON file for chrome://tracing or
https://ui.perfetto.dev (one process row per rank).

>>> t = Timeline()
>>> t.begin(); t.lap("pack"); t.lap("communicate")
>>> sorted(t.summary())
['communicate', 'pack']
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from meta.common.files import write_text

if TYPE_CHECKING:
    from meta.lv3.comm.communicator import Communicator

PHASES = ("compute", "pack", "communicate", "unpack", "update")


class Timeline:
    """(phase, start ns, end ns) events of this rank, from ``time.perf_counter_ns``.

    ``perf_counter_ns`` is CLOCK_MONOTONIC on Linux, shared by the processes of one machine, so
    ranks on one node line up in the trace; across nodes each rank's clock is its own.
    """

    def __init__(self) -> None:
        self.events: list[tuple[str, int, int]] = []
        """(phase, start ns, end ns) of every lap of the steps, in order: what ``summary``
        divides into phases per step."""
        self.background_events: list[tuple[str, int, int]] = []
        """What ran beside the steps' phases (allreduces overlapped with the backward):
        traced on a row of its own, not in the phases' shares, so never counted twice."""
        self.after_events: list[tuple[str, int, int]] = []
        """Laps after ``end_steps`` (``finish``'s final average): reported apart, not spread
        over the steps."""
        self.steps = 0
        """Steps begun (``begin`` calls): what per-step figures divide by."""
        self._last: int | None = None
        self._after = False

    def begin(self) -> None:
        """A step starts: the time since the last lap was spent computing."""
        now = time.perf_counter_ns()
        if self._last is not None:
            self.events.append(("compute", self._last, now))
        self._last = now
        self.steps += 1

    def lap(self, phase: str) -> None:
        """``phase`` ran from the previous lap (or ``begin``, or ``end_steps``) until now."""
        now = time.perf_counter_ns()
        events = self.after_events if self._after else self.events
        events.append((phase, self._last if self._last is not None else now, now))
        self._last = now

    def end_steps(self) -> None:
        """Training's steps are over (``Strategy.train`` calls it before ``finish``): the time
        since the last lap (the last epoch's evaluation, logging) is no phase's, and what is
        lapped from now on (``finish``'s final average) goes to ``after_events``. Before
        this, a model-averaging run's final average was lapped from the last step's update,
        so the last evaluation counted as communication, spread over the steps: a phase
        report showed 21.5 ms of communication per step in an 11.1 ms step (issue 45)."""
        self._last = time.perf_counter_ns()
        self._after = True

    @staticmethod
    def now() -> int:
        """The clock the timeline uses: ``time.perf_counter_ns()``."""
        return time.perf_counter_ns()

    def background(self, phase: str, start_ns: int) -> None:
        """``phase`` ran from ``start_ns`` until now beside the phases (overlapped)."""
        self.background_events.append((phase, start_ns, time.perf_counter_ns()))

    def summary(self) -> dict[str, dict[str, float]]:
        """Per phase: total seconds, mean seconds per step and share of the recorded time."""
        totals: dict[str, int] = {}
        for phase, start, end in self.events:
            totals[phase] = totals.get(phase, 0) + end - start
        everything = sum(totals.values()) or 1
        steps = max(self.steps, 1)
        return {phase: {"total_s": ns * 1e-9, "per_step_s": ns * 1e-9 / steps,
                        "share": ns / everything} for phase, ns in totals.items()}

    def format_summary(self) -> str:
        """Total and per-step time of each phase and its share, longest first, then the step
        they add up to (every phase is a part of it: ``communicate`` is the time a step
        waited for messages, not what moved while it computed); then what ran overlapped
        (not added) and after the last step (not per step), as a text table."""
        rows = [f"{'phase':<12} {'total s':>9} {'per step':>10} {'share':>7}"]
        summary = self.summary()
        for phase, s in sorted(summary.items(), key=lambda kv: -kv[1]["total_s"]):
            rows.append(f"{phase:<12} {s['total_s']:>9.3f} {s['per_step_s'] * 1e3:>8.3f}ms "
                        f"{s['share']:>6.1%}")
        if summary:
            total = sum(s["total_s"] for s in summary.values())
            step = sum(s["per_step_s"] for s in summary.values())
            rows.append(f"{'step':<12} {total:>9.3f} {step * 1e3:>8.3f}ms {1:>6.1%}")
        steps = max(self.steps, 1)
        for title, events, per in (
                ("overlapped with the phases above (not added to the step)",
                 self.background_events, True),
                ("after the last step (finish; not per step)", self.after_events, False)):
            totals: dict[str, int] = {}
            for phase, start, end in events:
                totals[phase] = totals.get(phase, 0) + end - start
            if totals:
                rows.append(f"{title}: " + ", ".join(
                    f"{phase} {ns * 1e-6 / (steps if per else 1):.3f} ms"
                    + (" per step" if per else "") for phase, ns in totals.items()))
        if self.events and not self.steps:
            rows.append("no step called begin(): the figures per step are totals")
        return "\n".join(rows)

    def trace_events(self, pid: int, origin_ns: int = 0) -> list[dict]:
        """This rank's events in Chrome's trace format (complete events, times in µs)."""
        return [{"name": phase, "cat": "step", "ph": "X", "pid": pid, "tid": tid,
                 "ts": (start - origin_ns) / 1e3, "dur": (end - start) / 1e3}
                for tid, events in ((0, self.events + self.after_events),
                                    (1, self.background_events))
                for phase, start, end in events]


def chrome_trace(timeline: Timeline, comm: Communicator, path: str | Path,
                 role: str = "worker") -> Path | None:
    """Gather every rank's events on rank 0 and write them to ``path``; None on other ranks.

    Collective: every rank of ``comm`` must call it. Events travel pickled, once, at the end.
    """
    first = timeline.events[0][1] if timeline.events else None
    gathered = comm.gather_obj((role, first, timeline.events))
    if gathered is None:
        return None
    origin = min((f for _, f, _ in gathered if f is not None), default=0)
    events: list[dict] = []
    for rank, (rank_role, _, rank_events) in enumerate(gathered):
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank} ({rank_role})"}})
        shifted = Timeline()
        shifted.events = rank_events
        events.extend(shifted.trace_events(rank, origin))
    return write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
