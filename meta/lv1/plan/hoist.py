"""Inference plans: the forward steps that compute only from the graph's arrays and constants
run once, in the prepare program, instead of on every call.

A T5 encoder's relative position bias is a Gather of its (buckets, heads) table by bucket
indices that fold to a constant, and a Transpose of that: the same (1, heads, T, T) array on
every call, 70 us of a 2.4 ms batch-1 inference at 1 thread; onnxruntime folds it, since every
initializer is a constant to it. Here the table is a parameter that may change, so the steps
move to the prepare program, which the executor runs again whenever the graph's arrays may
have changed (its version, a backward step of another plan), as it does for the weights it
packs: the values stay what the forward would compute.

A forward step is hoisted when it is of a deterministic operator (``PURE``: no random
operator, no custom or Python operator whose effects the plan cannot see), reads at least one
value, and every value it reads is the graph's own array or a constant that no forward step
writes, or the output of a hoisted step; every value it writes is an arena value that no other
step writes. Its outputs read by a step left in the forward, or fetched, become arrays the plan
keeps across calls (``owned``); those only hoisted steps read stay in the arena, alive within
the prepare program (which runs before the forward: the arena's later steps reuse the bytes).
Plans with a backward keep every step where it is (their prepare runs on every step anyway).
"""

from __future__ import annotations

from meta.lv1.plan.builder import PlanBuilder
from meta.lv1.plan.memory import Value, root

# Operators whose steps compute their outputs from their inputs alone.
PURE = frozenset({
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "Div", "Equal", "Erf",
    "Exp", "Expand", "Flatten", "Floor", "Gather", "GatherElements", "GatherND", "Gemm",
    "Greater", "GreaterOrEqual", "Identity", "Less", "LessOrEqual", "Log", "MatMul", "Max",
    "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pad", "Pow", "Range", "Reciprocal", "ReduceMax",
    "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape", "Sigmoid", "Sign", "Slice",
    "Softmax", "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Trilu",
    "Unsqueeze", "Where", "Xor",
})


def hoist(pb: PlanBuilder, values: dict[str, Value], fetched: set[str], backprop: bool,
          placement: dict[str, str]) -> list[str]:
    """Move the constant forward steps of an inference plan to its prepare program (the module
    docstring says which); returns the nodes whose steps moved."""
    if backprop:
        return []
    writers: dict[str, int] = {}
    for step in pb.steps:
        for name in step.writes:
            r = root(values, name)
            writers[r] = writers.get(r, 0) + 1
    forward = [s for s in pb.steps if s.phase == "forward"]
    written = {root(values, n) for s in pb.steps if s.phase != "prepare" for n in s.writes}
    constant = {n for n, v in values.items()
                if v.storage in ("external", "owned") and n not in written}
    made: set[str] = set()  # roots a hoisted step writes
    moved = []
    for step in forward:
        roots = [root(values, n) for n in step.writes]
        if step.op_type not in PURE or placement.get(step.node, "").startswith("python") \
                or not step.reads or not roots:
            continue
        if not all(root(values, n) in constant or root(values, n) in made for n in step.reads):
            continue
        if not all(values[r].storage == "arena" and writers.get(r) == 1 for r in roots):
            continue
        step.phase = "prepare"
        made.update(roots)
        moved.append(step)
    if not moved:
        return []
    kept = {root(values, n) for s in pb.steps if s.phase != "prepare" for n in s.reads}
    kept |= {root(values, n) for n in fetched if n in values}
    for r in made & kept:
        values[r].storage = "owned"
    return list(dict.fromkeys(s.node for s in moved))
