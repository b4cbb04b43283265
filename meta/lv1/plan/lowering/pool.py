"""Pooling lowering: max, average and global pooling on oneDNN, forward and backward, in the
layout the activations are kept in. C++ side: cpp/plan/pool.cpp."""

from __future__ import annotations

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context


def pool(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4 or not ctx.float32(x, out) or any(o for o in node.outputs[1:]):
        return None
    t = node.op_type
    if t in ("GlobalAveragePool", "GlobalMaxPool"):
        kernel, strides, pads, dil = list(shape[2:]), [1, 1], [0, 0], [1, 1]
        alg = "max" if t == "GlobalMaxPool" else "avg_exclude"
    else:
        win = op.window(np.broadcast_to(F32.type(0), shape))
        kernel, strides, pads, dil = (list(win.kernel), list(win.strides),
                                      list(win.pads_begin), list(win.dilations))
        if t == "MaxPool":
            alg = "max"
        else:
            include = bool(getattr(op, "count_include_pad", 0))
            if include and any(win.extra_end):
                return None
            alg = "avg_include" if include else "avg_exclude"
    layout = pb.value(x).layout
    train = ctx.needs(x)
    k = ctx.rt.Pool(list(shape), list(ctx.shape(out)), layout, alg, kernel, strides, pads, dil,
                    train)
    ctx.kernels.append(k)
    y = pb.output(out, ctx.shape(out), F32, layout)
    pb.step(t, [x], [y], lambda a: [k.forward(a(x), a(y))])
    if not train:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x)
        pb.step(f"{t} backward", [g], [dest], lambda a: [k.backward(a(g), a(dest))], "backward")
    return Lowered(node, backward, "onednn")
