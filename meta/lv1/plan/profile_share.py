"""What a plan's Python steps cost: each node's share of a measured step, and the one line the
planned executor prints when Python steps take more than 5 % of a training step.

A plan says where each node runs (``Plan.placement``: "onednn", "native", "compiled",
"python", ...), but not what that costs: a user could not tell that one ``Pow`` left to numpy
took 92 % of GPT-2's step (issue 41). The C++ programs can time every step they run
(``Program.profile``; ``step_ns`` adds up per step); this module turns those times into a
share per node and in Python steps.

The executor watches the first training steps of its first training plan only: the first
call is left alone (first-touch costs of the arena and the kernels), the next ``WATCHED``
calls are timed, then timing is switched off again (unless the executor profiles anyway), so
the rest of the run pays nothing. ``meta inspect --plan`` uses the same measurement
(``measure``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from meta.lv1.executor import Profile, ProfileRow  # noqa: F401 - the inherited __init__ names it

THRESHOLD = 0.05  # above this share of a step, the executor says so
SKIPPED = 1  # calls left untimed first
WATCHED = 3  # calls timed after them


def programs(plan) -> list[tuple[object, list]]:
    """(program, the planned step of each of its steps) for everything a training call runs:
    prepare, forward, and the backward (its segments where a gradient hook cut it)."""
    out = [(plan.programs[p], plan.records[p]) for p in ("prepare", "forward")
           if p in plan.programs]
    if plan.segments:
        out += [(program, owners) for program, _, owners in plan.segments]
    elif "backward" in plan.programs:
        out.append((plan.programs["backward"], plan.records["backward"]))
    return out


def snapshot(plan) -> list[list[int]]:
    """Every program's accumulated step times so far (zeros before its first timed run)."""
    return [list(program.step_ns) or [0] * len(program) for program, _ in programs(plan)]


def python_placement(where: str | None) -> bool:
    """Whether a placement is a Python step ("python", "python (LSTM: clip)")."""
    return str(where).startswith("python")


@dataclass
class NodeTime:
    node: str
    op_type: str
    placement: str
    ns: int


@dataclass
class Share:
    """Measured time per node in one call (each step's fastest of ``steps`` calls):
    ``python_share`` of the total went to nodes whose placement is a Python step."""

    nodes: list[NodeTime] = field(default_factory=list)
    total_ns: int = 0
    steps: int = 0

    @property
    def python_ns(self) -> int:
        return sum(t.ns for t in self.nodes if python_placement(t.placement))

    @property
    def python_share(self) -> float:
        return self.python_ns / self.total_ns if self.total_ns else 0.0

    def top_python(self, count: int = 3) -> list[NodeTime]:
        return sorted((t for t in self.nodes if python_placement(t.placement)),
                      key=lambda t: -t.ns)[:count]

    def share(self, t: NodeTime) -> float:
        return t.ns / self.total_ns if self.total_ns else 0.0

    def line(self) -> str:
        """The one line the executor prints: the share and the nodes that take most of it."""
        top = ", ".join(f"{t.node!r} ({t.op_type}) {self.share(t):.1%}"
                        for t in self.top_python())
        return (f"meta: planned executor: Python steps take {self.python_share:.1%} of a "
                f"training step (measured over steps {SKIPPED + 1}-{SKIPPED + self.steps}): "
                f"{top}; `meta inspect --plan MODEL.onnx` lists every node's placement")


def share_between(plan, snapshots: list[list[list[int]]]) -> Share:
    """The time each node's steps took in one call, from snapshots taken before the first
    timed call and after each: every step's fastest call (a loaded machine preempts a
    step now and then; its best call is what it costs)."""
    per_node: dict[str, int] = {}
    kinds: dict[str, str] = {}
    total = 0
    calls = list(zip(snapshots, snapshots[1:]))
    for k, (_, owners) in enumerate(programs(plan)):
        for j, owner in enumerate(owners):
            ns = min(after[k][j] - before[k][j] for before, after in calls)
            total += ns
            node = owner.node or "(the plan's own steps)"
            per_node[node] = per_node.get(node, 0) + ns
            kinds.setdefault(node, owner.op_type or owner.name)
    nodes = [NodeTime(n, kinds[n], plan.placement.get(n, "plan"), ns)
             for n, ns in per_node.items()]
    nodes.sort(key=lambda t: -t.ns)
    return Share(nodes, total, len(calls))


class Watch:
    """The executor's watch over its first training plan's first calls (see the module)."""

    def __init__(self) -> None:
        self.plan = None
        self.calls = 0
        self.snapshots: list[list[list[int]]] = []
        self.result: Share | None = None
        self.done = False

    def before(self, plan) -> None:
        """Before a training call on ``plan``: time its steps when in the window."""
        if self.done:
            return
        if self.plan is None:
            self.plan = plan
        if plan is not self.plan:
            return
        self.calls += 1
        if self.calls == SKIPPED + 1:
            for program, _ in programs(plan):
                program.profile = True
            self.snapshots = [snapshot(plan)]

    def after(self, plan, keep_profiling: bool = False) -> None:
        """After a training call on ``plan``: at the window's end, the share, and the line
        when it is over ``THRESHOLD``; timing stays on only with ``keep_profiling``."""
        if self.done or plan is not self.plan or self.calls <= SKIPPED:
            return
        self.snapshots.append(snapshot(plan))
        if self.calls < SKIPPED + WATCHED:
            return
        self.done = True
        self.result = share_between(plan, self.snapshots)
        if not keep_profiling:
            for program, _ in programs(plan):
                program.profile = False
        if self.result.python_share > THRESHOLD:
            print(self.result.line(), file=sys.stderr, flush=True)


def measure(executor, feeds: dict, loss: str | None, steps: int = WATCHED) -> Share:
    """Run ``steps`` timed calls (after one untimed) of ``executor`` (a ``PlannedExecutor``)
    on ``feeds``: training steps when ``loss`` names a scalar, else inferences; the time of
    each node of its plan."""
    def call() -> None:
        if loss is None:
            executor.inference(feeds)
        else:
            executor.inference_and_backprop(feeds, loss)

    call()
    plan = executor._last
    if plan is None or executor.unplanned:
        raise ValueError(f"no plan: {executor.unplanned or 'the planned runtime is missing'}")
    for program, _ in programs(plan):
        program.profile = True
    snapshots = [snapshot(plan)]
    for _ in range(steps):
        call()
        snapshots.append(snapshot(plan))
    return share_between(plan, snapshots)


@dataclass
class PlannedProfile(Profile):
    """The planned executor's ``profile_table()``: the table per op type, plus the share of
    the recorded time spent in Python steps and the nodes that took most of it."""

    python_share: float = 0.0
    python_nodes: list[tuple[str, str, float]] = field(default_factory=list)  # node, op, share

    @classmethod
    def from_plan_records(cls, records, placement: dict[str, str]) -> PlannedProfile:
        base = Profile.from_records(records)
        per_node: dict[str, list] = {}
        total = 0
        for node, op_type, _phase, ns in records:
            total += ns
            if python_placement(placement.get(node)):
                per_node.setdefault(node, [op_type, 0])[1] += ns
        nodes = sorted(((n, op, ns / total) for n, (op, ns) in per_node.items()),
                       key=lambda t: -t[2]) if total else []
        return cls(base.rows, base.total_ms, sum(s for *_, s in nodes), nodes)

    def __str__(self) -> str:
        top = ", ".join(f"{n!r} ({op}) {s:.1%}" for n, op, s in self.python_nodes[:3])
        return (super().__str__() + f"\nPython steps: {self.python_share:.1%} of the time"
                + (f" ({top})" if top else ""))
