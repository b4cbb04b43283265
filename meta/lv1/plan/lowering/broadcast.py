"""Two patterns of current decoders that left the plan as Python steps (issue 41): RMSNorm's
``torch.rsqrt`` exported as ``Div(1, Sqrt(...))`` (a constant scalar divided by a tensor,
which ``binary`` cannot put first), and grouped-query attention's ``Expand`` of K and V from
[B, KV, 1, T, d] to [B, KV, G, T, d] (one run of broadcast axes).

``Div(c, x)``: oneDNN's pow, c * x^-1, forward and backward (as ``Reciprocal``).
``Expand`` with one contiguous run of broadcast axes: a copy of each row into its ``mid``
places (``broadcast_mid``), backward their sum (``reduce_mid``); any other expansion of a
float32 or bool tensor (a mask broadcast over heads and queries), and ``Tile``, as one copy of
the fused pointwise kernel (cpp/plan/fused.cpp) reading the input through broadcast strides,
backward the sum over the repeated axes (``fused.sum_to``). Tile is seen as the input's
axes interleaved with their repeats, (r0, d0, r1, d1, ...), which is the output's bytes. A
shape or repeats fed at run time: Expand runs the operator (its shape could change); Tile
checks the fed repeats equal the traced ones when it runs (``expect_ints``). Anything else:
``None``, and the caller's kernel (``binary``) or the operator's own code runs it.
"""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.eltwise import binary
from meta.lv1.plan.lowering.fused import BOOL, Program, _coalesce, _strides, sum_to


def div(ctx: Context, node: Node, op) -> Lowered | None:
    """``Div(c, x)`` with ``c`` a constant finite scalar and the output x's shape: c * x^-1;
    any other Div: ``binary``'s kernel."""
    a, x = node.inputs[:2]
    out = node.outputs[0]
    c = ctx.constant(a)
    if c is None or c.size != 1 or not np.isfinite(c).all() or not ctx.float32(x, out) \
            or ctx.shape(out) != ctx.shape(x):
        return binary(ctx, node, op)
    alpha = float(np.asarray(c, np.float64).reshape(()))
    pb = ctx.pb
    v = pb.value(x)
    layout = v.layout
    dims = list(v.shape) or [1]  # oneDNN has no 0-d tensors
    y = pb.output(out, v.shape, F32, layout)
    pb.step(node.op_type, [x], [y],
            lambda arr: [pb.rt.eltwise(dims, layout, "pow", alpha, -1.0, arr(x), arr(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")
    use_dst = pb.rt.eltwise_has_dst_form("pow", alpha)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x)
        saved = y if use_dst else x
        pb.step(f"{node.op_type} backward", [saved, g], [dest],
                lambda arr: [pb.rt.eltwise_backward(dims, layout, "pow", alpha, -1.0, use_dst,
                                                    arr(saved), arr(g), arr(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


def broadcast_run(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(outer, mid, inner) when ``dst`` repeats ``src`` (padded with leading 1s) along one
    contiguous run of axes where ``src`` is 1; None for any other expansion."""
    src = (1,) * (len(dst) - len(src)) + tuple(src)
    if len(src) != len(dst):
        return None
    grown = [i for i, (s, d) in enumerate(zip(src, dst)) if s != d]
    if not grown or any(src[i] != 1 for i in grown) or grown != list(range(grown[0],
                                                                          grown[-1] + 1)):
        return None
    return prod(dst[:grown[0]]), prod(dst[grown[0]:grown[-1] + 1]), prod(dst[grown[-1] + 1:])


def expand(ctx: Context, node: Node, op) -> Lowered | None:
    """``Expand`` of a float32 tensor along one run of axes to a constant (or folded)
    shape (see the module)."""
    x, out = node.inputs[0], node.outputs[0]
    if ctx.dtype(x) not in (F32, BOOL) or ctx.constant(node.inputs[1]) is None:
        return None  # a shape fed at run time may differ from the traced one: the operator's
    run = broadcast_run(ctx.shape(x), ctx.shape(out))
    if run is None or ctx.dtype(x) == BOOL:
        rank = len(ctx.shape(out))
        padded = [1] * (rank - len(ctx.shape(x))) + list(ctx.shape(x))
        strides = _strides(ctx.shape(x), ctx.shape(out))
        return broadcast_copy(ctx, node, list(ctx.shape(out)), strides, padded)
    outer, mid, inner = run
    pb = ctx.pb
    x_in = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out), F32)
    pb.step(node.op_type, [x_in], [y],
            lambda a: [pb.rt.broadcast_mid(outer, mid, inner, 1.0, a(x_in), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x_in)
        pb.step(f"{node.op_type} backward", [g], [dest],
                lambda a: [pb.rt.reduce_mid(outer, mid, inner, 1.0, a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "native")


def broadcast_copy(ctx: Context, node: Node, dims: list[int], strides: list[int],
                   reduced: list[int]) -> Lowered | None:
    """``node``'s output (``dims``, contiguous) = its first input read through ``strides``
    (0 along a repeated axis), by the fused pointwise kernel; backward the output's gradient
    summed to ``reduced`` (dims with 1 where repeated), which is the input's bytes."""
    x, out = node.inputs[0], node.outputs[0]
    dtype = ctx.dtype(x)
    if dtype not in (F32, BOOL) or ctx.dtype(out) != dtype or prod(dims) == 0 \
            or getattr(ctx.rt, "pointwise", None) is None:
        return None
    p = Program()
    code, registers, regs = p.compile([p.emit("load", 0)])
    cdims, (cstrides,) = _coalesce(tuple(dims), [strides])
    kind = 1 if dtype == BOOL else 0
    pb = ctx.pb
    x_in = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out), dtype)
    label = f"{node.op_type} (broadcast copy)"
    pb.step(node.op_type, [x_in], [y], lambda a: [pb.rt.pointwise(
        label, cdims, [(a(x_in), kind, cstrides)], [(a(y), kind, False, regs[0])], code,
        registers)])
    if not ctx.needs(x):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x_in)
        pb.step(f"{node.op_type} backward", [g], [dest],
                lambda a: [sum_to(pb.rt, dims, reduced, a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "native")


def tile(ctx: Context, node: Node, op) -> Lowered | None:
    """``Tile`` of a float32 or bool tensor (see the module): constant repeats, or fed ones
    checked against the traced repeats when the step runs."""
    x, repeats = node.inputs[:2]
    shape, out = ctx.shape(x), ctx.shape(node.outputs[0])
    if not shape or any(d == 0 for d in shape) or len(out) != len(shape):
        return None
    reps = [o // d for o, d in zip(out, shape)]
    dims, strides, reduced = [], [], []
    inner = 1
    for r, d in reversed(list(zip(reps, shape))):
        dims[:0], strides[:0], reduced[:0] = [r, d], [0, inner], [1, d]
        inner *= d
    lowered = broadcast_copy(ctx, node, dims, strides, reduced)
    if lowered is not None and ctx.constant(repeats) is None:
        pb = ctx.pb
        pb.step("Tile (check repeats)", [repeats], [], lambda a: [pb.rt.expect_ints(
            a(repeats), reps, f"node {node.name!r}: Tile's repeats")])
    return lowered
