"""Gather's kernels (C++ side: cpp/plan/embedding.cpp). The embedding: rows of a (vocabulary,
width) float32 table by int32 or int64 token ids that vary (a feed, not a constant), and so
any float32 Gather by such ids along any axis. And Gather by constant indices along any axis
(``gather_by_constant``, for what is no view: a BERT's first token, ``h[:, 0]``, was a Python
step).

Forward copies each token's row (OpenMP over tokens). Backward scatter-adds dy's rows into the
table's gradient, each thread owning a range of the width's columns (or whole slabs before the
axis) and adding the tokens in their order, so every entry is summed in token order as numpy's
add.at does and the bits do not depend on the thread count (data-parallel replicas and re-runs
agree). It adds to the gradient when another node has written it already (the GPT's head, tied
to this table), and otherwise zeroes it first. The embedding used to be a Python step (numpy's
take; a stable argsort of the tokens and one reduceat per run of equal tokens): 1.5-2.3 ms of
the BERT benchmark's step for 2048 tokens, and a Python step stops the plan's run for the GIL
and breaks its OpenMP team. Ids out of range fail as the Python step did: an IndexError naming
the node.
"""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context

ID_TYPES = (np.dtype(np.int32), np.dtype(np.int64))


def embedding(ctx: Context, node: Node, op) -> Lowered | str | None:
    """The kernel for Gather(data, ids) of float32 data by ids that vary, along any axis (the
    embedding: axis 0 of a (rows, width) table); None when the data is not float32
    (``views.gather`` then decides), a reason when the ids' dtype is one the kernel does not
    take (the operator's own code runs it)."""
    data, idx = node.inputs
    out = node.outputs[0]
    shape = ctx.shape(data)
    if not shape or not ctx.float32(data, out) or ctx.dtype(idx).kind not in "iu":
        return None
    if ctx.dtype(idx) not in ID_TYPES:
        return f"ids of dtype {ctx.dtype(idx)}: the kernel takes int32 and int64"
    axis = int(op.axis) % len(shape)
    return _gather(ctx, node, axis, prod(ctx.shape(idx)), [idx], lambda a: a(idx))


def gather_by_constant(ctx: Context, node: Node, index: np.ndarray, axis: int) -> Lowered:
    """Gather of float32 data by constant ``index`` along ``axis``: the data seen as (outer,
    rows, inner), the output as (outer, index.size, inner)."""
    ids = np.ascontiguousarray(index.reshape(-1), np.int64)
    ctx.objects[f"gather indices {node.name}"] = ids  # the steps point into it: kept
    return _gather(ctx, node, axis, ids.size, [], lambda a: ids)


def _gather(ctx: Context, node: Node, axis: int, n: int, id_inputs: list[str],
            ids_of) -> Lowered:
    """The forward and backward steps of a Gather of ``n`` ids along ``axis`` of the node's
    float32 data, seen as (outer, rows, inner): ``ids_of(a)`` gives the ids' array (a fed
    tensor's buffer, listed in ``id_inputs``, or a constant the plan keeps)."""
    pb = ctx.pb
    data, out, name = node.inputs[0], node.outputs[0], node.name
    shape = ctx.shape(data)
    outer, rows, inner = prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])
    src = pb.require_layout(data, "plain")
    y = pb.output(out, ctx.shape(out))
    pb.step("Gather", [src, *id_inputs], [y],
            lambda a: [pb.rt.gather(outer, rows, inner, n, ids_of(a), a(src), a(y), name)])
    if not ctx.needs(data):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, add = pb.grad_target(src, can_accumulate=True)
        pb.step("Gather backward", [*id_inputs, g, *([dest] if add else [])], [dest],
                lambda a: [pb.rt.gather_backward(outer, rows, inner, n, ids_of(a), a(g),
                                                 a(dest), add, name)], "backward")
    return Lowered(node, backward, "native")
