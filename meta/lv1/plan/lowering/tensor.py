"""Softmax, LogSoftmax and Concat. C++ side: cpp/plan/tensor.cpp (the fused softmax
cross-entropy loss: loss.py)."""

from __future__ import annotations

from math import prod

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context


def softmax(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not shape or not ctx.float32(x, out):
        return None
    axis = int(op.axis) % len(shape)
    log = node.op_type == "LogSoftmax"
    if type(op).since < 13:  # the input coerced to 2-D at axis
        dims, axis = [prod(shape[:axis]), prod(shape[axis:])], 1
    else:
        dims = list(shape)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, shape)
    pb.step(node.op_type, [xin], [y], lambda a: [pb.rt.softmax(dims, axis, log, a(xin), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(xin)
        pb.step(f"{node.op_type} backward", [y, g], [dest],
                lambda a: [pb.rt.softmax_backward(dims, axis, log, a(y), a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


def concat(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    xs = list(node.inputs)
    out = node.outputs[0]
    if not xs or any(not x for x in xs) or not ctx.float32(*xs, out):
        return None
    rank = len(ctx.shape(out))
    axis = int(op.axis) % rank
    layout = pb.value(xs[0]).layout
    if rank != 4 or axis != 1 or layout not in ("nhwc", "plain") \
            and any(ctx.shape(x)[1] % 16 for x in xs):
        layout = "plain"
    ins = [pb.require_layout(x, layout) for x in xs]
    dims = [list(ctx.shape(x)) for x in xs]
    y = pb.output(out, ctx.shape(out), F32, layout)
    pb.step("Concat", ins, [y], lambda a: [pb.rt.concat(dims, layout, axis, [a(x) for x in ins],
                                                        a(y))])
    if not any(ctx.needs(x) for x in xs):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        targets = [pb.grad_target(x)[0] if ctx.needs(x) else None for x in ins]
        pb.step("Concat backward", [g], [t for t in targets if t],
                lambda a: list(pb.rt.concat_backward(dims, layout, axis, a(g),
                                                     [a(t) if t else None for t in targets])),
                "backward")
    return Lowered(node, backward, "onednn")
