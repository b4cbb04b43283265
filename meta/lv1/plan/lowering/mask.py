"""Tensors computed from their element indices as plan steps (cpp/plan/mask.cpp): ``Trilu``
(any dtype: a masked copy of bytes; backward dy masked the same way) and ``Range`` (float32,
float64, int32, int64; not differentiable). Their scalar inputs (Trilu's k, Range's start,
limit and delta) are read when the step runs, so fed ones stay exact; a Range whose fed
values give another length than the traced one raises (a plan's shapes are fixed). Both fold
when their inputs are constants (the usual causal mask and position ids of an export)."""

from __future__ import annotations

from math import prod

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context
from meta.lv1.plan.lowering.scan import SCAN_DTYPES, gradient_into


def trilu(ctx: Context, node: Node, op) -> Lowered | None:
    x, out = node.inputs[0], node.outputs[0]
    k = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    shape = ctx.shape(x)
    dtype = ctx.dtype(x)
    if len(shape) < 2 or dtype.kind not in "fiub" or ctx.dtype(out) != dtype \
            or k is not None and (ctx.dtype(k).kind != "i" or prod(ctx.shape(k)) != 1) \
            or ctx.needs(x) and dtype.kind != "f":
        return None
    pb = ctx.pb
    batch, rows, cols = prod(shape[:-2]), shape[-2], shape[-1]
    upper = bool(op.upper)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, shape, dtype)
    pb.step(node.op_type, [xin, *([k] if k else [])], [y], lambda a: [pb.rt.trilu(
        batch, rows, cols, a(k) if k else None, upper, a(xin), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, after = gradient_into(pb, xin, f"{node.op_type} backward")
        pb.step(f"{node.op_type} backward", [g, *([k] if k else [])], [dest],
                lambda a: [pb.rt.trilu(batch, rows, cols, a(k) if k else None, upper, a(g),
                                       a(dest))], "backward")
        after()
    return Lowered(node, backward, "native")


def range_node(ctx: Context, node: Node, op) -> Lowered | None:
    start, limit, delta = node.inputs[:3]
    out = node.outputs[0]
    dtype = ctx.dtype(out)
    if dtype not in SCAN_DTYPES or any(ctx.dtype(x) != dtype or prod(ctx.shape(x)) != 1
                                       for x in (start, limit, delta)):
        return None
    pb = ctx.pb
    n = prod(ctx.shape(out))
    y = pb.output(out, ctx.shape(out), dtype)
    pb.step(node.op_type, [start, limit, delta], [y], lambda a: [pb.rt.range(
        a(start), a(limit), a(delta), a(y), n, node.name)])
    return Lowered(node, None, "native")
