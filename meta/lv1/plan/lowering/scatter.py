"""``ScatterND`` as a plan step (cpp/plan/scatter.cpp): data copied, then each slice of
``updates`` written at (``reduction`` none) or combined into (add, mul, max, min) the slice its
index tuple names, the indices read when the step runs (a caller may feed them). Backward, as
ops/scatter_nd.py: for none, dy with the written slices zeroed to data and dy's slices at the
indices to updates; for add, dy to data and the same slices to updates; for mul, max and
min, from the forward's values (data, updates and the output, kept for it): dy times the
product of the updates an element received, or dy where the output kept data's value / took
the update's."""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context
from meta.lv1.plan.lowering.scan import SCAN_DTYPES, gradient_into


REDUCTIONS = ("none", "add", "mul", "max", "min")


def scatter_nd(ctx: Context, node: Node, op) -> Lowered | None:
    data, indices, updates = node.inputs[:3]
    out = node.outputs[0]
    dtype = ctx.dtype(data)
    shape, ishape = ctx.shape(data), ctx.shape(indices)
    if dtype not in SCAN_DTYPES or ctx.dtype(updates) != dtype \
            or ctx.dtype(indices) != np.int64 or not ishape or not shape \
            or ishape[-1] > len(shape) or ishape[-1] < 1:
        return None
    reduction = str(op.reduction)
    grads = [ctx.needs(data), ctx.needs(updates)]
    if any(grads) and dtype.kind != "f" or reduction not in REDUCTIONS:
        return None
    k, n = ishape[-1], prod(ishape[:-1])
    dims = list(shape)
    pb = ctx.pb
    d_in, u_in = pb.require_layout(data, "plain"), pb.require_layout(updates, "plain")
    y = pb.output(out, shape, dtype)
    pb.step(node.op_type, [d_in, indices, u_in], [y], lambda a: [pb.rt.scatter_nd(
        dims, k, n, a(indices), reduction, a(d_in), a(u_in), a(y), node.name)])
    if not any(grads):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        label = f"{node.op_type} backward"
        dx, after_x = gradient_into(pb, d_in, label) if grads[0] else (None, lambda: None)
        du, after_u = gradient_into(pb, u_in, label) if grads[1] else (None, lambda: None)
        if reduction in ("none", "add"):
            pb.step(label, [g, indices], [w for w in (dx, du) if w],
                    lambda a: [pb.rt.scatter_nd_backward(
                        dims, k, n, a(indices), reduction == "none", a(g),
                        a(dx) if dx else None, a(du) if du else None, node.name)], "backward")
        else:  # the forward's values decide
            pb.step(label, [g, indices, d_in, u_in, y], [w for w in (dx, du) if w],
                    lambda a: [pb.rt.scatter_nd_backward_reduce(
                        dims, k, n, a(indices), reduction, a(d_in), a(u_in), a(y), a(g),
                        a(dx) if dx else None, a(du) if du else None, node.name)], "backward")
        after_x()
        after_u()
    return Lowered(node, backward, "native")
