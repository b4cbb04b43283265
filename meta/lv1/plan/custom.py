"""User operators in a plan: a C++ operator (``meta.register_cpp_op``) as a compiled step, and
a notice, once per operator, when a node leaves the oneDNN kernels.

A C++ operator's kernels are bound once to the plan's buffers (``CppOperator.bind_forward``,
``bind_backward``): the forward writes its outputs in place in the arena and the backward its
gradients, with no allocation, no copy and no Python in the kernel's call but the step's own
entry (a ``PyStep`` calling the bound kernel's ``run``, which releases the GIL). Its placement
is ``"compiled"``. A Python operator stays a Python step (``kernels.python_node``), placement
``"python"``. Either way the planned executor says so once per operator on stderr, so a run that
leaves the fast path is never silent (issue: a Python SiLU ran at a third of ReLU's speed
without a word).

Hooked into the planner by two lines (see ``lower`` and ``announce``).
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv0.cpp_ops import CppOperator
from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.memory import Value

COMPILED = "compiled"
_announced: set[tuple[str, str, str]] = set()  # (domain, op type, placement), this process


def _py_step(fn: Callable[[], None], name: str):
    from meta.lv1.plan.runtime import module

    return module().PyStep(fn, name)


def lower(ctx, node: Node) -> Lowered | None:
    """``node`` as a compiled step if its operator is a C++ one whose library can bind to the
    plan's buffers (float32 or float64, every input given, one dtype); None otherwise (the
    planner then runs the operator's own code in a Python step)."""
    op = ctx.ops[node.name]
    if not isinstance(op, CppOperator) or not hasattr(op.module, "bind_forward"):
        return None
    if not node.inputs or any(not x for x in node.inputs) or any(not o for o in node.outputs):
        return None
    dtypes = {np.dtype(ctx.dtype(x)) for x in [*node.inputs, *node.outputs]}
    if len(dtypes) != 1 or dtypes.pop() not in (np.float32, np.float64):
        return None
    pb: PlanBuilder = ctx.pb
    ins = [pb.require_layout(x, "plain") for x in node.inputs]
    outs = [pb.output(o, ctx.shape(o), ctx.dtype(o)) for o in node.outputs]

    def build(a):
        kernel = op.bind_forward([_contiguous(a(x), node, x) for x in ins],
                                 [_contiguous(a(o), node, o) for o in outs])
        return [_py_step(kernel.run, node.name)]

    pb.step(node.op_type, ins, outs, build)
    needs = [ctx.needs(x) and i not in op.no_grad_inputs for i, x in enumerate(node.inputs)]
    if not any(needs) or not op.module.has_backward:
        return Lowered(node, None, COMPILED)

    def backward(pb: PlanBuilder) -> None:
        grads = [pb.grad(o) for o in outs]
        if all(g is None for g in grads):
            return
        # An output nothing downstream reads gets zeros, as the kernels' contract says.
        dys = [g if g is not None else _zeros(pb, o) for o, g in zip(outs, grads)]
        # The kernel overwrites what it writes: a gradient that must add up goes to a
        # temporary the builder adds in (flush).
        targets = [pb.grad_target(x) if need else None for x, need in zip(ins, needs)]
        dests = [t[0] if t else None for t in targets]

        def build(a):
            kernel = op.bind_backward(
                [_contiguous(a(x), node, x) for x in ins], [a(o) for o in outs],
                [a(g) for g in dys], needs,
                [_contiguous(a(d), node, d) if d else None for d in dests])
            return [_py_step(kernel.run, f"{node.name} backward")]
        pb.step(f"{node.op_type} backward", [*ins, *outs, *dys], [d for d in dests if d],
                build, "backward")
    return Lowered(node, backward, COMPILED)


def _zeros(pb: PlanBuilder, like: str) -> str:
    v = pb.value(like)
    name = pb.fresh(f"{like}@zero-grad")
    pb.values[name] = Value(name, v.shape, v.dtype, storage="owned",
                            array=np.zeros(v.shape, v.dtype))
    return name


def _contiguous(array: np.ndarray, node: Node, name: str) -> np.ndarray:
    """The array itself: a copy (what binding would make of a strided one) would be read or
    written once, at binding, and never again."""
    if not array.flags.c_contiguous:  # plain plan values and graph arrays are
        raise ValueError(f"{node.describe()}: the plan's buffer for {name!r} is not "
                         f"C-contiguous")
    return array


def announce(nodes: list[Node], placement: dict[str, str]) -> None:
    """One line on stderr per operator (domain, type) the first time a plan runs it outside
    the oneDNN kernels: as a compiled C++ step or as a Python step."""
    for node in nodes:
        where = placement.get(node.name)
        if where != COMPILED and not str(where).startswith("python"):
            continue  # "python (why)": a kernel's own reason for leaving this node to Python
        key = (node.domain, node.op_type, where)
        if key in _announced:
            continue
        _announced.add(key)
        op = f"{node.op_type}" + (f" (domain {node.domain})" if node.domain else "")
        how = ("a compiled C++ step on the plan's buffers" if where == COMPILED else
               "a Python step (the operator's own code, slower than a kernel)"
               + where[len("python"):])
        print(f"meta: planned executor: {op}, node {node.name!r}, leaves the oneDNN kernels: "
              f"{how}", file=sys.stderr, flush=True)
