"""Matrix-product lowerings: Gemm and MatMul on oneDNN's matmul (transposes read through
strides, a fused bias and activation) and their backward products. C++ side:
cpp/plan/matmul.cpp. With the plan's precision "bf16" (``Context.bf16``) every product here,
forward and backward, reads its operands in bf16 and accumulates float32: each operand's one
bf16 copy (``precision.bf16_operand``), shared by the forward and the backward products, and
the output written in bf16 when only bf16 products read it (``precision.keeps_bf16``).

In an inference plan (float32, no gradient), a MatMul by a 2-D weight the graph holds (an
exporter's Linear without bias: MatMul by a (K, N) initializer, or a tied head's Transpose of
an embedding) reads that weight packed once by the plan's prepare program into the layout
oneDNN's matmul chooses (matmul.cpp ``PackedMatmul``), packed again when the weights change, as
onnxruntime pre-packs a constant B: read plain, brgemm packs it again on every call (T5's MLP,
128 x 256 x 1024 at 1 thread: 389 -> 340 us). An activation after it is applied by the product
with or without a bias (T5's ReLU was its own step: 20 us at batch 1)."""

from __future__ import annotations

from itertools import permutations
from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context
from meta.lv1.plan.lowering.attention import attention
from meta.lv1.plan.lowering.eltwise import Eltwise, activation_backward, fused_activation
from meta.lv1.plan.lowering.views import drop_transpose, transposed_source
from meta.lv1.plan.precision import (
    BF16_READERS,
    bf16_holder,
    bf16_operands,
    gradient_target,
    keeps_bf16,
    takes_bf16_gradient,
)


def gemm_shapes_ok(ctx: Context, node: Node, op) -> bool:
    """Whether ``gemm`` lowers this Gemm (2-D float32 operands, alpha 1, beta 1 with C)."""
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    if not ctx.float32(a, b, c, out) or len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
        return False
    if float(op.alpha) != 1.0 or (c and float(op.beta) != 1.0):
        return False
    return not c or ctx.shape(c) in ((ctx.shape(out)[1],), (1, ctx.shape(out)[1]))


def matmul_dims(ctx: Context, node: Node) -> tuple[list[int], list[int]] | None:
    """The (a, b) dims ``matmul`` computes a MatMul's product with, None when it does not."""
    a, b = node.inputs
    sa, sb = ctx.shape(a), ctx.shape(b)
    if not ctx.float32(a, b, node.outputs[0]) or len(sa) < 2 or len(sb) < 2:
        return None
    if len(sb) == 2:  # (..., M, K) . (K, N): one product of (prod(...) * M, K) rows
        return [prod(sa[:-1]), sa[-1]], list(sb)
    if sa[:-2] == sb[:-2]:
        return list(sa), list(sb)
    return None


def reads_bf16(ctx: Context, node: Node, name: str) -> bool:
    """Whether this lowering reads ``name`` as a bf16 operand of ``node``'s product (a bf16
    plan's Gemm, or MatMul by a 2-D weight: never the attention's, which reads its operands
    through strided views): the producer of ``name`` may then write it in bf16 only."""
    if not ctx.bf16 or node.name in ctx.absorbed or list(node.inputs[:2]).count(name) != 1:
        return False
    if node.op_type == "Gemm":
        return name in node.inputs[:2] and gemm_shapes_ok(ctx, node, ctx.ops[node.name])
    if node.op_type == "MatMul":
        return node.inputs[0] == name and len(ctx.shape(node.inputs[1])) == 2 \
            and matmul_dims(ctx, node) is not None
    return False


BF16_READERS.append(reads_bf16)


def product_output(ctx: Context, y: str) -> str:
    """Where a product writes its output ``y``: ``y``, or its bf16 holder when only bf16
    products read it."""
    return bf16_holder(ctx, y) if keeps_bf16(ctx, y) else y


def matmul_step(pb: PlanBuilder, a_name: str, a_dims, trans_a: bool, b_name: str, b_dims,
                trans_b: bool, out: str, bias: str = "", post: Eltwise | None = None,
                accumulate: bool = False, phase: str = "forward", bf16: bool = False) -> None:
    a_dims, b_dims = list(a_dims), list(b_dims)
    pb.step("matmul bf16" if bf16 else "matmul",
            [a_name, b_name, bias, *([out] if accumulate else [])], [out],
            lambda a: [pb.rt.matmul(a_dims, b_dims, trans_a, trans_b, a(a_name), a(b_name),
                                    a(bias) if bias else None, a(out),
                                    post.name if post else "", post.alpha if post else 0.0,
                                    post.beta if post else 0.0, accumulate, bf16)], phase)


def product_backward(pb: PlanBuilder, ctx: Context, g: str, a: str, a_dims, trans_a: bool,
                     b: str, b_dims, trans_b: bool, keys: tuple[str, str] | None = None
                     ) -> str:
    """Gradients of y = op(a) . op(b) (batched over leading dims of equal size) from dy; the
    gradients are ``keys``' (default: a's and b's), where a and b are the values the forward
    read (in a bf16 plan their bf16 copies; dy then is read through its own). Returns the dy
    the products read (a bias's gradient sums the same: ``bias_gradient``).

    A bf16 plan computes b's gradient first: a (the layer's saved bf16 input) is then free
    before a's gradient is written, so the two never share the arena (at sequence 256 the
    GPT's backward peak held the MLP's hidden bf16 input beside its gradient: 4 MiB)."""
    key_a, key_b = keys or (a, b)
    (g,) = bf16_operands(ctx, "backward", g)
    n = len(a_dims)
    m_dim = a_dims[n - 1] if trans_a else a_dims[n - 2]
    n_dim = b_dims[n - 2] if trans_b else b_dims[n - 1]
    g_dims = [*a_dims[:n - 2], m_dim, n_dim]

    def grad_a() -> None:
        dest, add = gradient_target(ctx, key_a)
        if not trans_a:  # da = dy . op(b)^T
            matmul_step(pb, g, g_dims, False, b, b_dims, not trans_b, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)
        else:  # da = op(b) . dy^T
            matmul_step(pb, b, b_dims, trans_b, g, g_dims, True, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)

    def grad_b() -> None:
        dest, add = pb.grad_target(key_b, can_accumulate=True)
        if not trans_b:  # db = op(a)^T . dy
            matmul_step(pb, a, a_dims, not trans_a, g, g_dims, False, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)
        else:  # db = dy^T . op(a)
            matmul_step(pb, g, g_dims, True, a, a_dims, trans_a, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)

    wanted = [(ctx.needs(key_a), grad_a), (ctx.needs(key_b), grad_b)]
    for needed, make in (wanted[::-1] if ctx.bf16 else wanted):
        if needed:
            make()
    return g


def bias_gradient(pb: PlanBuilder, ctx: Context, g: str, bias: str, rows: int, n: int) -> None:
    """The bias's gradient: dy (``g``, as the backward products read it) summed over its
    ``rows``, in float32. In a bf16 plan that is dy's bf16 holder or copy, as autocast sums
    its bf16 output's gradient: half the bytes read, and dy's float32 bytes are free once
    converted (at sequence 256 the GPT's backward peak held them beside its products')."""
    dest, add = pb.grad_target(bias, can_accumulate=True)
    pb.step("bias gradient", [g], [dest],
            lambda x: [pb.rt.column_sum(rows, n, x(g), x(dest), add)], "backward")


def gemm(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    if not gemm_shapes_ok(ctx, node, op):
        return None
    n_out = ctx.shape(out)[1]
    trans_a, trans_b = bool(op.transA), bool(op.transB)
    act = fused_activation(ctx, node, out)
    last = out
    if act is not None:
        ctx.absorb(node, act[0])
        last = act[0].outputs[0]
    y = pb.output(last, ctx.shape(out))
    a_in = pb.require_layout(a, "plain")
    a16, b16 = bf16_operands(ctx, "forward", a_in, b)
    matmul_step(pb, a16, ctx.shape(a), trans_a, b16, ctx.shape(b), trans_b,
                y if act else product_output(ctx, y), c, act[1] if act else None,
                bf16=ctx.bf16)
    if act is None:  # its backward reads dy as products (and a column sum) read it
        takes_bf16_gradient(ctx, y)
    kind = "onednn bf16" if ctx.bf16 else "onednn"
    if not any(ctx.needs(v) for v in (a, b, c)):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        g16 = product_backward(pb, ctx, g, a16, ctx.shape(a), trans_a, b16, ctx.shape(b),
                               trans_b, (a_in, b))
        if ctx.needs(c):
            bias_gradient(pb, ctx, g16, c, ctx.shape(out)[0], n_out)
    return Lowered(node, backward, kind)


def matmul(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    a, b = node.inputs
    out = node.outputs[0]
    sb, so = ctx.shape(b), ctx.shape(out)
    dims = matmul_dims(ctx, node)
    if dims is None:
        return None
    a_dims, b_dims = dims
    fused = attention(ctx, node)  # scores . softmax . V as one chunked node
    if fused is not None:
        return fused
    if len(sb) > 2 and not ctx.backprop and not ctx.bf16:
        strided = strided_product(ctx, node, a_dims, b_dims)
        if strided is not None:
            return strided
    bias, last, act = "", out, None
    add = ctx.single_consumer(out, ("Add",), first=False) if len(sb) == 2 else None
    if add is not None and len(add.inputs) == 2 and add.inputs[0] != add.inputs[1]:
        bias = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        if ctx.shape(bias) not in ((so[-1],), (1, so[-1])) or not ctx.float32(bias) \
                or ctx.shape(add.outputs[0]) != so:
            bias = ""
    if bias:  # a linear layer's bias (MatMul + Add) in the product, as Gemm's and addmm's
        ctx.absorb(node, add)
        last = add.outputs[0]
        act = fused_activation(ctx, node, last)
        if act is not None:
            ctx.absorb(node, act[0])
            last = act[0].outputs[0]
    a_in = pb.require_layout(a, "plain")
    # a weight transposed by the graph (a tied head's embedding, an exporter's W^T): the
    # product reads the weight through strides, the Transpose's copy of it dropped
    b_in, trans_b = b, False
    found = transposed_source(ctx, b, [1, 0]) if len(sb) == 2 else None
    if found is not None and found[0] in ctx.traced and found[0] != a:
        b_in, trans_b = drop_transpose(ctx, node, found), True
        b_dims = b_dims[::-1]
    rows, n_out = a_dims[0], so[-1]
    if len(sb) == 2 and packs_weight(ctx, b_in):
        if act is None and not bias:  # the activation after a product without a bias
            act = fused_activation(ctx, node, out)
            if act is not None:
                ctx.absorb(node, act[0])
                last = act[0].outputs[0]
        residual = ""
        add = ctx.single_consumer(last, ("Add",), first=False)
        if add is not None:
            residual = residual_operand(ctx, add, last)
            if residual:
                ctx.absorb(node, add)
                last = add.outputs[0]
        packed_product(ctx, a_in, b_in, trans_b, bias, act[1] if act else None, residual,
                       pb.output(last, so), rows, a_dims[1], n_out)
        return Lowered(node, None, "onednn")
    y = pb.output(last, so)
    a16, b16 = bf16_operands(ctx, "forward", a_in, b_in)
    matmul_step(pb, a16, a_dims, False, b16, b_dims, trans_b,
                y if act else product_output(ctx, y), bias, act[1] if act else None,
                bf16=ctx.bf16)
    if act is None:  # its backward reads dy as products (and a column sum) read it
        takes_bf16_gradient(ctx, y)
    kind = "onednn bf16" if ctx.bf16 else "onednn"
    if not (ctx.needs(a) or ctx.needs(b_in) or ctx.needs(bias)):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        g16 = product_backward(pb, ctx, g, a16, a_dims, False, b16, b_dims, trans_b,
                               (a_in, b_in))
        if ctx.needs(bias):
            bias_gradient(pb, ctx, g16, bias, rows, n_out)
    return Lowered(node, backward, kind)


def split_heads_source(ctx: Context, x: str) -> tuple[str, int, list[int]] | None:
    """``transposed_source`` for an operand of a batched product made by a Transpose of any
    permutation that keeps a unit stride in one of the last two dims (oneDNN's brgemm reads
    such views as fast as dense arrays): (source, its step, the permutation), or None."""
    n = len(ctx.shape(x))
    for perm in permutations(range(n)):
        if n - 1 in perm[-2:] and list(perm) != list(range(n)):
            found = transposed_source(ctx, x, list(perm))
            if found is not None:
                return (*found, list(perm))
    return None


def strided_product(ctx: Context, node: Node, a_dims, b_dims) -> Lowered | None:
    """An inference plan's batched MatMul whose operands a Transpose made (an attention that
    is not fused: T5's scores without 1/sqrt(d), Q, K and V split into heads) reads them
    through strides, the Transposes' copies dropped (T5 at batch 1: three a layer, 5-11 us
    each); None when no operand is such."""
    pb = ctx.pb
    a, b = node.inputs
    reads = {}
    for x in dict.fromkeys((a, b)):
        found = split_heads_source(ctx, x) if pb.value(x).layout == "plain" else None
        if found is not None:
            reads[x] = (drop_transpose(ctx, node, found[:2]), found[2])
    if not reads:
        return None

    def operand(arr, x: str):
        if x not in reads:
            return arr(x)
        source, perm = reads[x]
        return arr(source).transpose(perm)
    a_dims, b_dims = list(a_dims), list(b_dims)
    y = pb.output(node.outputs[0], ctx.shape(node.outputs[0]))
    pb.step("matmul", [reads.get(a, (a,))[0], reads.get(b, (b,))[0]], [y],
            lambda arr: [pb.rt.matmul(a_dims, b_dims, False, False, operand(arr, a),
                                      operand(arr, b), None, arr(y))])
    return Lowered(node, None, "onednn")


def residual_operand(ctx: Context, add: Node, y: str) -> str:
    """The value ``add`` adds to the product's output ``y`` when the product can add it as it
    writes (a transformer's residual x + o(h)): of ``y``'s shape, float32, plain, made before
    the product; "" otherwise."""
    if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return ""
    r = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
    pb = ctx.pb
    if r not in pb.values or not ctx.float32(r) or ctx.shape(r) != ctx.shape(y) \
            or ctx.shape(add.outputs[0]) != ctx.shape(y) or pb.value(r).layout != "plain":
        return ""
    return r


def packs_weight(ctx: Context, b: str) -> bool:
    """Whether a product reads its 2-D weight ``b`` packed once (``packed_product``): in a
    float32 plan taking no gradient, ``b`` the graph's own array as it lies (a parameter or
    initializer: the prepare program, run again when the graph's version moves, repacks it)."""
    if ctx.bf16 or ctx.backprop or not hasattr(ctx.rt, "PackedMatmul"):
        return False
    v = ctx.pb.value(b)
    return v.storage == "external" and v.layout == "plain" and len(v.shape) == 2 \
        and v.dtype == np.float32


def packed_product(ctx: Context, x: str, w: str, trans_w: bool, bias: str,
                   post: Eltwise | None, residual: str, y: str, m: int, k: int, n: int) -> None:
    """y = residual + post(x . op(w) + bias) over ``m`` rows (matmul.cpp ``PackedMatmul``),
    ``w`` packed into oneDNN's own layout by a prepare step into a buffer the plan owns, kept
    between calls."""
    pb = ctx.pb
    kernel = pb.rt.PackedMatmul(m, k, n, trans_w, bool(bias), bool(residual),
                                post.name if post else "", post.alpha if post else 0.0,
                                post.beta if post else 0.0)
    buf = pb.output(pb.fresh(f"{w}@packed"), (-(-kernel.weights_bytes() // 4),))
    pb.values[buf].storage = "owned"  # the plan's own, kept between calls
    pb.step("matmul weights -> packed", [w], [buf],
            lambda arr: [kernel.pack(arr(w), arr(buf))], "prepare")
    pb.step("matmul packed", [x, buf, bias, residual], [y],
            lambda arr: [kernel.forward(arr(x), arr(buf), arr(bias) if bias else None,
                                        arr(residual) if residual else None, arr(y))])
