"""A Gemm of 1 to 4 rows by a weight stored as (N, K) rows (``transB=1``: PyTorch's Linear as
exported), or a 1x1 Conv of 1 to 4 images of 1x1 pixels (squeeze-and-excitation's two layers,
the same product), on ``cpp/plan/gemv.cpp``, in requests that take no gradient through it
(inference).

At batch 1 such a product is one read of the weight and nothing else, and oneDNN's matmul
copies the transposed weight into its blocks on every call: MobileNetV3's 576 x 1024 head
took 125 us of a 360 us inference at 1 thread (onnxruntime's pre-packed Gemm ~80 us); the
kernel reads the weight once (45 us from cache, 80 from memory, as in the network). The
squeeze-and-excitation convolutions were oneDNN convolutions of one pixel, 2-5 us each, for
what the kernel does in about 1 us. The activation after the product is applied as its
outputs are written when the kernel has it (ReLU, LeakyRelu, HardSigmoid, HardSwish, Clip),
as ``gemm`` and ``conv`` fuse it into oneDNN's. Everything else (more rows or pixels, a
transposed A, groups, padding, a BatchNormalization after it, a gradient, a bf16 plan) is
left to ``lowering.matmul.gemm`` and ``lowering.conv.conv``.

A Gemm of more rows by a weight the graph holds (an initializer), in an inference plan, runs
on oneDNN's matmul with the weight packed once into the layout it chooses by the plan's prepare
program (matmul.cpp's ``PackedMatmul``, as the inference MatMuls; again when the weights
change), as onnxruntime pre-packs: read plain or transposed, brgemm packs it again on every
call (MobileNetV3's head at batch 32: 310 us, packed 220).

The planned compiler asks ``lower`` before ``kernels.lower`` (``compiler.lower_phase``).
"""

from __future__ import annotations

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.eltwise import fused_activation
from meta.lv1.plan.lowering.matmul import gemm_shapes_ok, packed_product, packs_weight

MAX_ROWS = 4  # cpp/plan/gemv.cpp's kMaxRows
POST = ("relu", "hardsigmoid", "hardswish", "clip")  # the activations the kernel applies


def takes(ctx: Context, node: Node) -> bool:
    """Whether ``lower`` runs this node, in a float32 plan, taking no gradient: a float32 Gemm
    (alpha 1, beta 1) of at most ``MAX_ROWS`` rows by a transposed 2-D weight, or a Conv of
    one group, a 1x1 kernel and no padding over at most ``MAX_ROWS`` images of 1x1 pixels."""
    if node.op_type not in ("Gemm", "Conv") or ctx.bf16 or len(node.outputs) != 1:
        return False
    if any(ctx.needs(v) for v in (*node.inputs[:3], *node.outputs)):
        return False
    if node.op_type == "Conv":
        return _one_pixel_conv(ctx, node)
    op = ctx.ops[node.name]
    if not gemm_shapes_ok(ctx, node, op) or bool(op.transA) or not bool(op.transB):
        return False
    return ctx.shape(node.inputs[0])[0] <= MAX_ROWS


def _one_pixel_conv(ctx: Context, node: Node) -> bool:
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    if not ctx.float32(x, w, b, node.outputs[0]):
        return False
    sx, sw = ctx.shape(x), ctx.shape(w)
    if len(sx) != 4 or sx[2:] != (1, 1) or sx[0] > MAX_ROWS or len(sw) != 4 \
            or sw[2:] != (1, 1) or sw[1] != sx[1] or int(ctx.ops[node.name].group) != 1:
        return False
    if ctx.single_consumer(node.outputs[0], ("BatchNormalization",)) is not None:
        return False  # the convolution's lowering folds it in
    try:
        win = ctx.ops[node.name].window(np.broadcast_to(F32.type(0), sx),
                                        np.broadcast_to(F32.type(0), sw),
                                        np.broadcast_to(F32.type(0), ctx.shape(b)) if b else None)
    except ValueError:
        return False
    return not any(win.pads_begin) and not any(win.pads_end) \
        and ctx.shape(node.outputs[0]) == (sx[0], sw[0], 1, 1)


def takes_packed(ctx: Context, node: Node) -> bool:
    """Whether ``packed`` runs this node: an inference plan's float32 Gemm (alpha 1, beta 1,
    A not transposed) of more than ``MAX_ROWS`` rows by a 2-D graph array (``packs_weight``)."""
    if node.op_type != "Gemm" or len(node.outputs) != 1:
        return False
    op = ctx.ops[node.name]
    return gemm_shapes_ok(ctx, node, op) and not bool(op.transA) \
        and ctx.shape(node.inputs[0])[0] > MAX_ROWS and packs_weight(ctx, node.inputs[1])


def packed(ctx: Context, node: Node) -> Lowered:
    """The node as oneDNN's matmul by its weight packed in the prepare program
    (``lowering.matmul.packed_product``, which the inference MatMuls use too)."""
    op = ctx.ops[node.name]
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    m, k = ctx.shape(a)
    n = ctx.shape(out)[1]
    act = fused_activation(ctx, node, out)
    last = out
    if act is not None:
        ctx.absorb(node, act[0])
        last = act[0].outputs[0]
    x = ctx.pb.require_layout(a, "plain")
    packed_product(ctx, x, b, bool(op.transB), c, act[1] if act else None, "",
                   ctx.pb.output(last, (m, n)), m, k, n)
    return Lowered(node, None, "onednn")


def lower(ctx: Context, node: Node) -> Lowered | None:
    """The node as one ``gemv`` step, or oneDNN's matmul by its packed weight (``packed``),
    or None where neither takes it."""
    if not takes(ctx, node):
        return packed(ctx, node) if takes_packed(ctx, node) else None
    pb = ctx.pb
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    m, k = ctx.shape(a)[:2]
    n = ctx.shape(b)[0]
    act = fused_activation(ctx, node, out)
    if act is not None and act[1].name not in POST:
        act = None
    last = out
    if act is not None:
        ctx.absorb(node, act[0])
        last = act[0].outputs[0]
    y = pb.output(last, (m, n) if node.op_type == "Gemm" else (m, n, 1, 1))
    x = pb.require_layout(a, "plain")
    post, alpha, beta = (act[1].name, act[1].alpha, act[1].beta) if act else ("", 0.0, 0.0)
    pb.step("gemv", [x, b, c], [y],
            lambda arr: [pb.rt.gemv(m, k, n, arr(x), arr(b), arr(c) if c else None, arr(y),
                                    post, alpha, beta)])
    return Lowered(node, None, "native")
