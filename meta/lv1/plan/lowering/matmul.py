"""Matrix-product lowerings: Gemm and MatMul on oneDNN's matmul (transposes read through
strides, a fused bias and activation) and their backward products. C++ side:
cpp/plan/matmul.cpp. With the plan's precision "bf16" (``Context.bf16``) every product here,
forward and backward, reads its operands in bf16 and accumulates float32."""

from __future__ import annotations

from math import prod

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context
from meta.lv1.plan.lowering.attention import attention
from meta.lv1.plan.lowering.eltwise import Eltwise, activation_backward, fused_activation


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
                     b: str, b_dims, trans_b: bool) -> None:
    """Gradients of y = op(a) . op(b) (batched over leading dims of equal size) from dy."""
    n = len(a_dims)
    m_dim = a_dims[n - 1] if trans_a else a_dims[n - 2]
    n_dim = b_dims[n - 2] if trans_b else b_dims[n - 1]
    g_dims = [*a_dims[:n - 2], m_dim, n_dim]
    if ctx.needs(a):
        dest, add = pb.grad_target(a, can_accumulate=True)
        if not trans_a:  # da = dy . op(b)^T
            matmul_step(pb, g, g_dims, False, b, b_dims, not trans_b, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)
        else:  # da = op(b) . dy^T
            matmul_step(pb, b, b_dims, trans_b, g, g_dims, True, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)
    if ctx.needs(b):
        dest, add = pb.grad_target(b, can_accumulate=True)
        if not trans_b:  # db = op(a)^T . dy
            matmul_step(pb, a, a_dims, not trans_a, g, g_dims, False, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)
        else:  # db = dy^T . op(a)
            matmul_step(pb, g, g_dims, True, a, a_dims, trans_a, dest, accumulate=add,
                        phase="backward", bf16=ctx.bf16)


def gemm(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    if not ctx.float32(a, b, c, out) or len(ctx.shape(a)) != 2 or len(ctx.shape(b)) != 2:
        return None
    if float(op.alpha) != 1.0 or (c and float(op.beta) != 1.0):
        return None
    n_out = ctx.shape(out)[1]
    if c and ctx.shape(c) not in ((n_out,), (1, n_out)):
        return None
    trans_a, trans_b = bool(op.transA), bool(op.transB)
    act = fused_activation(ctx, node, out)
    last = out
    if act is not None:
        ctx.absorb(node, act[0])
        last = act[0].outputs[0]
    y = pb.output(last, ctx.shape(out))
    a_in = pb.require_layout(a, "plain")
    matmul_step(pb, a_in, ctx.shape(a), trans_a, b, ctx.shape(b), trans_b, y, c,
                act[1] if act else None, bf16=ctx.bf16)
    kind = "onednn bf16" if ctx.bf16 else "onednn"
    if not any(ctx.needs(v) for v in (a, b, c)):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        product_backward(pb, ctx, g, a_in, ctx.shape(a), trans_a, b, ctx.shape(b), trans_b)
        if ctx.needs(c):
            dest, add = pb.grad_target(c, can_accumulate=True)
            m = ctx.shape(out)[0]
            pb.step("bias gradient", [g], [dest],
                    lambda x: [pb.rt.column_sum(m, n_out, x(g), x(dest), add)], "backward")
    return Lowered(node, backward, kind)


def matmul(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    a, b = node.inputs
    out = node.outputs[0]
    sa, sb, so = ctx.shape(a), ctx.shape(b), ctx.shape(out)
    if not ctx.float32(a, b, out) or len(sa) < 2 or len(sb) < 2:
        return None
    if len(sb) == 2:  # (..., M, K) . (K, N): one product of (prod(...) * M, K) rows
        a_dims, b_dims = [prod(sa[:-1]), sa[-1]], list(sb)
    elif sa[:-2] == sb[:-2]:
        a_dims, b_dims = list(sa), list(sb)
    else:
        return None
    fused = attention(ctx, node)  # scores . softmax . V as one chunked node
    if fused is not None:
        return fused
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
    y = pb.output(last, so)
    rows, n_out = a_dims[0], so[-1]
    matmul_step(pb, a_in, a_dims, False, b, b_dims, False, y, bias, act[1] if act else None,
                bf16=ctx.bf16)
    kind = "onednn bf16" if ctx.bf16 else "onednn"
    if not (ctx.needs(a) or ctx.needs(b) or ctx.needs(bias)):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        product_backward(pb, ctx, g, a_in, a_dims, False, b, b_dims, False)
        if ctx.needs(bias):
            dest, add = pb.grad_target(bias, can_accumulate=True)
            pb.step("bias gradient", [g], [dest],
                    lambda x: [pb.rt.column_sum(rows, n_out, x(g), x(dest), add)], "backward")
    return Lowered(node, backward, kind)
