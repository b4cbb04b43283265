"""``Slice`` along one axis with step 1 as a plan step: rotary embeddings' halves
(``x[..., :d/2]``, ``x[..., d/2:]``) left the plan as Python steps in every Llama-style export
(issue 41). Forward: oneDNN's reorder of the part (``concat_backward``, which copies each
part of a tensor along an axis out); backward: the part's gradient between zeros
(``concat``). A Slice that cuts nothing is a view. The Slices that build recurrent weights
fold into their LSTM/GRU first (``rnn.fold_slice``); any other Slice (several axes, a step,
constant bounds missing, not float32) runs the operator's own code.
"""

from __future__ import annotations

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.rnn import fold_slice
from meta.lv1.plan.memory import Value


def one_axis(ctx: Context, node: Node) -> tuple[int, int, int] | None:
    """(axis, start, stop) of a Slice (opset 10+: bounds as constant inputs) that cuts one
    axis with step 1; None for any other."""
    if len(node.inputs) < 3:
        return None
    shape = ctx.shape(node.inputs[0])
    given = [node.inputs[i] if len(node.inputs) > i else "" for i in range(1, 5)]
    consts = [ctx.constant(x) if x else None for x in given]
    if any(x and c is None for x, c in zip(given, consts)):
        return None  # bounds computed at run time
    starts, ends, axes, steps = consts
    starts, ends = np.ravel(starts), np.ravel(ends)
    axes = np.arange(len(starts)) if axes is None else np.ravel(axes)
    steps = np.ones(len(starts), np.int64) if steps is None else np.ravel(steps)
    cut = []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis = int(axis) % len(shape)
        lo, hi, st = slice(int(start), int(end), int(step)).indices(shape[axis])
        if (lo, hi, st) != (0, shape[axis], 1):
            cut.append((axis, lo, hi, st))
    if len(cut) != 1 or cut[0][3] != 1 or cut[0][2] <= cut[0][1]:
        return None
    return cut[0][:3]


def _bounds_constant(ctx: Context, node: Node) -> bool:
    return all(ctx.constant(x) is not None for x in node.inputs[1:] if x)


def slice_node(ctx: Context, node: Node, op) -> Lowered | None:
    folded = fold_slice(ctx, node, op)
    if folded is not None:
        return folded
    x, out = node.inputs[0], node.outputs[0]
    if not ctx.float32(x, out):
        return None
    cut = one_axis(ctx, node)
    if cut is None:
        if ctx.shape(x) == ctx.shape(out) and _bounds_constant(ctx, node):
            from meta.lv1.plan.lowering.views import view_node

            return view_node(ctx, node, op)  # cuts nothing: the input itself
        return None
    axis, lo, hi = cut
    shape = list(ctx.shape(x))
    parts = [(n, role) for n, role in ((lo, "before"), (hi - lo, "part"),
                                       (shape[axis] - hi, "after")) if n > 0]
    dims = [shape[:axis] + [n] + shape[axis + 1:] for n, _ in parts]
    pb = ctx.pb
    x_in = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out), F32)
    pb.step(node.op_type, [x_in], [y], lambda a: list(pb.rt.concat_backward(
        dims, "plain", axis, a(x_in), [a(y) if role == "part" else None for _, role in parts])))
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x_in)
        zeros = {role: _zeros(pb, f"{out}@{role}", d) for d, (_, role) in zip(dims, parts)
                 if role != "part"}
        ins = [g if role == "part" else zeros[role] for _, role in parts]
        pb.step(f"{node.op_type} backward", ins, [dest],
                lambda a: [pb.rt.concat(dims, "plain", axis, [a(i) for i in ins], a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


def _zeros(pb: PlanBuilder, hint: str, shape: list[int]) -> str:
    """A constant of zeros the backward's concat reads around the slice's gradient."""
    name = pb.fresh(hint)
    pb.values[name] = Value(name, tuple(shape), np.dtype(np.float32), storage="owned",
                            array=np.zeros(shape, np.float32))
    return name


def split(ctx: Context, node: Node, op) -> Lowered | None:
    """``Split`` of a float32 tensor (sizes constant: an attribute, a constant or folded
    input, or equal parts): each part copied out as Slice's is; backward the parts'
    gradients (zeros for a part nothing differentiates) concatenated. GPT-2's exports split
    the fused query/key/value product this way."""
    x = node.inputs[0]
    outs = list(node.outputs)
    if len(node.inputs) > 1 and node.inputs[1] and ctx.constant(node.inputs[1]) is None:
        return None  # sizes fed at run time may differ from the traced ones
    if not ctx.float32(x, *(o for o in outs if o)) or any(not o for o in outs):
        return None
    shape = list(ctx.shape(x))
    axis = int(getattr(op, "axis", 0)) % len(shape)
    if not shape[axis] or any(d == 0 for i, d in enumerate(shape) if i != axis):
        return None
    pb = ctx.pb
    x_in = pb.require_layout(x, "plain")
    for o in outs:  # an empty part (a rotary split keeping nothing back) has no bytes
        pb.output(o, ctx.shape(o), F32)
    outs = [o for o in outs if ctx.shape(o)[axis]]
    dims = [list(ctx.shape(o)) for o in outs]
    ys = outs
    pb.step(node.op_type, [x_in], ys, lambda a: list(pb.rt.concat_backward(
        dims, "plain", axis, a(x_in), [a(y) for y in ys])))
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        grads = [pb.grad(y) for y in ys]
        if all(g is None for g in grads):
            return
        dest, _ = pb.grad_target(x_in)
        ins = [g if g is not None else _zeros(pb, f"{y}@zero-grad", d)
               for g, y, d in zip(grads, ys, dims)]
        pb.step(f"{node.op_type} backward", ins, [dest],
                lambda a: [pb.rt.concat(dims, "plain", axis, [a(i) for i in ins], a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")
