"""Softmax, LogSoftmax, the fused softmax cross-entropy loss and Concat. C++ side:
cpp/plan/tensor.cpp."""

from __future__ import annotations

from math import prod

import numpy as np

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


def cross_entropy(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    scores, labels = node.inputs[:2]
    loss = node.outputs[0]
    logp_out = node.outputs[1] if len(node.outputs) > 1 else ""
    if (len(node.inputs) > 2 and node.inputs[2]) or op.ignore_index is not None \
            or op.reduction != "mean":
        return None
    shape = ctx.shape(scores)
    if len(shape) != 2 or not ctx.float32(scores) or ctx.dtype(labels) != np.int64 \
            or ctx.shape(labels) != shape[:1]:
        return None
    if logp_out and (ctx.consumers.get(logp_out) or logp_out in ctx.protected):
        return None
    n, c = shape
    s_in = pb.require_layout(scores, "plain")
    out = pb.output(loss, ())
    logp = pb.output(logp_out or pb.fresh("logp"), shape)
    pb.step("SoftmaxCrossEntropyLoss", [s_in, labels], [out, logp],
            lambda a: [pb.rt.cross_entropy(n, c, a(s_in), a(labels), a(out), a(logp))])
    if not ctx.needs(scores):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(out)
        if g is None:
            return
        dest, _ = pb.grad_target(s_in)
        pb.step("SoftmaxCrossEntropyLoss backward", [g, logp, labels], [dest],
                lambda a: [pb.rt.cross_entropy_backward(n, c, a(g), a(logp), a(labels),
                                                        a(dest))], "backward")
    return Lowered(node, backward, "native")


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
