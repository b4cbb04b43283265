"""SoftmaxCrossEntropyLoss as one fused step each way (C++ side: cpp/plan/loss.cpp): the
log-softmax over the classes and the negative log-likelihood of the labels, for scores
(N, C) or (N, C, d1...) with labels (N) or (N, d1...), every reduction, ``ignore_index`` and
class weights, exactly as the operator (ops/softmax_cross_entropy_loss.py) computes them. A
language model's loss is (N, vocab, T) with padding ignored: as a Python step it cost 7 % of a
GPT training step."""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context

REDUCTIONS = ("mean", "sum", "none")


def cross_entropy(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    scores, labels = node.inputs[:2]
    weights = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    loss = node.outputs[0]
    logp_out = node.outputs[1] if len(node.outputs) > 1 else ""
    shape = ctx.shape(scores)
    if len(shape) < 2 or not ctx.float32(scores, loss) or op.reduction not in REDUCTIONS \
            or ctx.dtype(labels) not in (np.int64, np.int32) or 0 in shape \
            or ctx.shape(labels) != shape[:1] + shape[2:]:
        return None  # the operator's own code, and its error where there is one
    if weights and (not ctx.float32(weights) or ctx.shape(weights) != shape[1:2]):
        return None
    n, c, d = shape[0], shape[1], prod(shape[2:])
    reduction = op.reduction
    ignore = None if op.ignore_index is None else int(op.ignore_index)
    s_in = pb.require_layout(scores, "plain")
    out = pb.output(loss, shape[:1] + shape[2:] if reduction == "none" else ())
    logp = pb.output(logp_out or pb.fresh("logp"), shape)
    denom = pb.output(pb.fresh("loss divisor"), (1,))
    name = node.name
    pb.step("SoftmaxCrossEntropyLoss", [s_in, labels, weights], [out, logp, denom],
            lambda a: [pb.rt.cross_entropy(name, n, c, d, reduction, ignore, a(s_in), a(labels),
                                           a(weights) if weights else None, a(out), a(logp),
                                           a(denom))])
    if not (ctx.needs(scores) or weights and ctx.needs(weights)):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(out)
        glogp = pb.grad(logp) if logp_out else None
        ds = pb.grad_target(s_in) if g is not None or glogp is not None else None
        dw = pb.grad_target(weights) if weights and (g is not None or glogp is not None) \
            else None
        if ds is None and dw is None:
            return
        ds, dw = ds and ds[0], dw and dw[0]
        pb.step("SoftmaxCrossEntropyLoss backward",
                [g, logp, labels, weights, denom, out, glogp], [ds, dw],
                lambda a: [pb.rt.cross_entropy_backward(
                    n, c, d, reduction, ignore, a(g) if g else None, a(logp), a(labels),
                    a(weights) if weights else None, a(denom), a(out),
                    a(glogp) if glogp else None, a(ds) if ds else None,
                    a(dw) if dw else None)], "backward")
    return Lowered(node, backward, "native")
