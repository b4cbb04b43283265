"""``CumSum`` as a plan step (cpp/plan/scan.cpp), forward and backward (the scan of dy the
other way round, as ops/cum_sum.py computes it), for float32, float64, int32 and int64. The
axis is read by the step when it runs, from the plan's array holding it: a fed axis stays
exact. Also ``gradient_into``, shared by this package's kernels whose dtype may be other than
float32: where a contribution to a gradient goes, and the add that follows it when it is not
the first (the builder's own add is float32's)."""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context, py_step

SCAN_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))


def gradient_into(pb: PlanBuilder, x: str, label: str):
    """(the value a backward step writes ``x``'s gradient contribution into, a function adding
    the steps that must follow it): float32 goes through the builder (its flush adds a later
    contribution); another dtype writes the gradient itself when first, else a temporary that
    one numpy step adds in (the builder's add reads float32)."""
    if pb.values[x].dtype == F32 or pb.grad(x) is None:
        dest, _ = pb.grad_target(x)
        return dest, lambda: None
    g = pb.grad(x)
    t = pb.temp(g)

    def after() -> None:
        pb.step(f"{label} (add)", [t, g], [g], lambda a: [py_step(
            lambda: np.add(a(g), a(t), out=a(g)), label)], "backward")
    return t, after


def cumsum(ctx: Context, node: Node, op) -> Lowered | None:
    x, axis = node.inputs[:2]
    out = node.outputs[0]
    dtype = ctx.dtype(x)
    if dtype not in SCAN_DTYPES or ctx.dtype(out) != dtype or not ctx.shape(x) \
            or ctx.dtype(axis).kind != "i" or prod(ctx.shape(axis)) != 1 \
            or ctx.needs(x) and dtype.kind != "f":
        return None
    pb = ctx.pb
    dims = list(ctx.shape(x))
    exclusive, reverse = bool(op.exclusive), bool(op.reverse)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out), dtype)
    pb.step(node.op_type, [xin, axis], [y], lambda a: [pb.rt.cumsum(
        dims, a(axis), exclusive, reverse, a(xin), a(y), node.name)])
    if not ctx.needs(x):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, after = gradient_into(pb, xin, f"{node.op_type} backward")
        pb.step(f"{node.op_type} backward", [g, axis], [dest], lambda a: [pb.rt.cumsum(
            dims, a(axis), exclusive, not reverse, a(g), a(dest), node.name)], "backward")
        after()
    return Lowered(node, backward, "native")
