"""Lowerings that cost no kernel or only a copy: views (Reshape, Flatten, Squeeze, Unsqueeze,
Identity, Dropout in inference), Gather of one constant index (a view; other Gathers are
``lowering.embedding``'s kernels), and Transpose (the runtime's transpose
step). C++ side: cpp/plan/runtime.cpp (reorder, transpose, copy, fill)."""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context, py_step
from meta.lv1.plan.lowering.embedding import embedding, gather_by_constant
from meta.lv1.plan.memory import Value


def dropout_is_identity(ctx: Context, node: Node, op) -> bool:
    """Whether a Dropout passes its input through here: in inference, or with ratio 0."""
    def input_value(i: int):
        name = node.inputs[i] if len(node.inputs) > i else ""
        return ctx.constant(name) if name else None

    if "is_test" in op.attributes:  # opset 6
        written = not op.is_test
    elif len(node.inputs) > 2 and node.inputs[2]:  # opset 12+: the training_mode input
        flag = input_value(2)
        if flag is None:
            return False
        written = bool(flag)
    else:
        written = False
    ratio = input_value(1) if len(node.inputs) > 1 and node.inputs[1] else \
        getattr(op, "ratio", 0.5)
    if ratio is None:
        return False
    return not ctx.mode(written) or float(np.asarray(ratio)) == 0


def view_node(ctx: Context, node: Node, op) -> Lowered | None:
    """Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout in inference: the output is the
    input's bytes with another shape."""
    pb = ctx.pb
    x, y = node.inputs[0], node.outputs[0]
    if node.op_type == "Dropout":
        if not dropout_is_identity(ctx, node, op) or any(ctx.used(o) for o in node.outputs[1:]):
            return None
    src = pb.require_layout(x, "plain")
    pb.view(y, src, ctx.shape(y))

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None or pb.alias_grad(src, y):
            return
        target = pb.grad_target(src, can_accumulate=True)
        if target is None:
            return
        dest, add = target
        n = prod(ctx.shape(y))
        if ctx.dtype(y) == F32:
            pb.step("view backward", [g], [dest],
                    lambda a: [pb.rt.copy(a(g), a(dest), n, add)], "backward")
            return

        def build(a):  # the runtime's copy is float32's: numpy's for the other dtypes
            grad, out = a(g).reshape(-1), a(dest).reshape(-1)

            def run() -> None:
                if add:
                    out[...] += grad
                else:
                    out[...] = grad
            return [py_step(run, f"{node.name} backward")]
        pb.step("view backward", [g, dest] if add else [g], [dest], build, "backward")
    return Lowered(node, backward if ctx.needs(x) else None, "view")


def transpose_perm(op, rank: int) -> list[int]:
    """A Transpose's permutation: its ``perm``, or ONNX's default, the axes reversed."""
    return list(op.perm) if op.perm is not None else list(range(rank))[::-1]


def transposed_source(ctx: Context, x: str, perm: list[int]) -> tuple[str, int] | None:
    """When ``x`` is the output of a Transpose by ``perm`` whose one reader is the product
    asking (the attention's split heads; a linear layer's transposed weight, a tied output
    head's embedding): the Transpose's input and the index of its step, which the product then
    drops, reading the input through strides instead (oneDNN's kernels take these layouts as
    they are: the copy, 1 MiB a layer and direction at the GPT benchmark's size, is saved;
    the dropped step's backward then finds no gradient and adds nothing: the product writes
    the input's); None otherwise."""
    pb = ctx.pb
    if x in ctx.protected or len(ctx.consumers.get(x, [])) != 1 \
            or len(ctx.shape(x)) != len(perm):
        return None
    for k in range(len(pb.steps) - 1, -1, -1):
        step = pb.steps[k]
        if x not in step.writes:
            continue
        op = ctx.ops.get(step.node)
        if step.name != "Transpose" or step.writes != (x,) or len(step.reads) != 1 \
                or op is None or pb.values[step.reads[0]].layout != "plain":
            return None
        if transpose_perm(op, len(perm)) != perm:
            return None
        return step.reads[0], k
    return None


def drop_transpose(ctx: Context, into: Node, found: tuple[str, int]) -> str:
    """Drop the Transpose step ``transposed_source`` found, the node ``into`` reading its
    input instead (``meta inspect`` lists it as fused into ``into``); returns that input."""
    source, k = found
    ctx.fused_into.setdefault(into.name, []).append(ctx.pb.steps[k].node)
    del ctx.pb.steps[k]
    return source


def channels_last_view(ctx: Context, x: str, out: str, perm: list[int]) -> str | None:
    """A Transpose between NCHW and NHWC that moves no byte, as a view (returns its placement,
    "view"; None where it does not apply): an NCHW value held channels-last ("nhwc") is the
    plain NHWC tensor perm (0, 2, 3, 1) asks for, and a plain NHWC value is the NCHW tensor
    perm (0, 3, 1, 2) asks for, held channels-last. ConvNeXt's blocks permute around their
    LayerNorm and MLP both ways: each was a reorder to plain and a transpose (50 us a block at
    batch 1). Inference only (no gradient through it), on arena values."""
    pb = ctx.pb
    v = pb.value(x)
    if ctx.needs(x) or len(v.shape) != 4 or v.storage != "arena" or v.dtype != F32:
        return None
    if v.layout == "nhwc" and perm == [0, 2, 3, 1]:
        layout = "plain"
    elif v.layout == "plain" and perm == [0, 3, 1, 2]:
        layout = "nhwc"
    else:
        return None
    shape = tuple(ctx.shape(out))
    nbytes = pb.rt.layout_bytes(list(shape), layout) if layout != "plain" else 0
    pb.values[out] = Value(out, shape, v.dtype, layout, "view", x, 0, nbytes=nbytes)
    return "view"


def transpose(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not ctx.float32(x, out) or not shape:
        return None
    perm = transpose_perm(op, len(shape))
    free = channels_last_view(ctx, x, out, perm)
    if free is not None:
        return Lowered(node, None, free)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out))
    pb.step("Transpose", [xin], [y], lambda a: [pb.rt.transpose(list(shape), perm, a(xin),
                                                                a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")
    inverse = list(np.argsort(perm))
    out_shape = list(ctx.shape(out))

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(xin)
        pb.step("Transpose backward", [g], [dest],
                lambda a: [pb.rt.transpose(out_shape, inverse, a(g), a(dest))], "backward")
    return Lowered(node, backward, "onednn")


def gather(ctx: Context, node: Node, op) -> Lowered | str | None:
    """Gather of one constant index along the first axis that has more than one element
    before it: a contiguous block of the input, so a view (the split of PyTorch's packed
    attention projections). Other constant indices and ids that vary: Gather's kernels
    (``lowering.embedding``)."""
    pb = ctx.pb
    data, idx = node.inputs
    out = node.outputs[0]
    index = ctx.constant(idx)
    shape = ctx.shape(data)
    if index is None:  # ids that vary: the embedding's kernel, if it takes them
        return embedding(ctx, node, op)
    if not shape or not ctx.float32(data, out):
        return None
    axis = int(op.axis) % len(shape)
    if index.size != 1 or any(d != 1 for d in shape[:axis]):
        return gather_by_constant(ctx, node, index, axis)
    i = int(index.reshape(())) % shape[axis]
    block = prod(shape[axis + 1:])
    src = pb.require_layout(data, "plain")
    pb.view(out, src, ctx.shape(out), offset=i * block)
    if not ctx.needs(data):
        return Lowered(node, None, "view")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(out)
        if g is None:
            return
        dest, add = pb.grad_target(src, can_accumulate=True)
        total = prod(shape)
        key = f"gather tiles {src}"
        if not add:  # the first contribution decides for its siblings
            ctx.objects[key] = src == data and _tiles(ctx, data, axis)
        tiled = ctx.objects.get(key, False)

        def build(a):
            region = a(dest).reshape(-1)[i * block:(i + 1) * block]
            if tiled:  # the siblings write the rest: no zeros, no sums
                return [pb.rt.copy(a(g), region, block, False)]
            steps = [] if add else [pb.rt.fill(a(dest), total, 0.0)]
            return [*steps, pb.rt.copy(a(g), region, block, True)]
        pb.step("Gather backward", [g, dest] if add else [g], [dest], build, "backward")
    return Lowered(node, backward, "view")


def _tiles(ctx: Context, data: str, axis: int) -> bool:
    """Whether ``data``'s gradient is exactly its one-index Gathers' gradients side by side:
    every reader of ``data`` is such a Gather (a view) along ``axis``, each index taken once,
    all indices taken, each Gather's output already given a gradient (the readers' backward
    ran). Their backward steps then copy their blocks in, where each would otherwise add its
    block to a gradient the first one zeroed whole (the split of PyTorch's packed attention
    projections into Q, K and V: 2% of the transformer benchmark's step at 2 threads)."""
    shape = ctx.shape(data)
    taken: set[int] = set()
    for reader in ctx.consumers.get(data, []):
        index = ctx.constant(reader.inputs[1]) if reader.op_type == "Gather" else None
        if index is None or index.size != 1 or reader.inputs[0] != data \
                or int(ctx.ops[reader.name].axis) % len(shape) != axis \
                or ctx.pb.grad(reader.outputs[0]) is None:
            return False
        taken.add(int(index.reshape(())) % shape[axis])
    return len(taken) == shape[axis] == len(ctx.consumers.get(data, []))
