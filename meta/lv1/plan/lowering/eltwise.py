"""Elementwise lowerings: oneDNN activations (and the ones other kernels fuse), binary ops with
broadcasting of one operand, Sum of n inputs, and ReduceMean/ReduceSum over adjacent axes.
C++ side: cpp/plan/eltwise.cpp."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.precision import (BF16, BF16_READERS, bf16_holder, gradient_target,
                                     keeps_bf16, stored, takes_bf16_gradient)


@dataclass
class Eltwise:
    name: str
    alpha: float = 0.0
    beta: float = 0.0


def eltwise_of(ctx: Context, node: Node, op) -> Eltwise | None:
    """The oneDNN activation computing ``node`` (None when there is none). Softplus and Mish
    are left to their operators' stable forms: oneDNN's soft_relu and mish compute
    log(1 + e^x) as written, which loses every digit in float32 for x <= -8 (softplus(-20) =
    2e-9 is below 1's last bit), forward and backward."""
    t = node.op_type
    if t == "Relu":
        return Eltwise("relu")
    if t == "LeakyRelu":
        return Eltwise("relu", float(np.float32(op.alpha)))
    if t == "Sigmoid":
        return Eltwise("logistic")
    if t == "Tanh":
        return Eltwise("tanh")
    if t == "Elu":
        return Eltwise("elu", float(op.alpha))
    if t == "Exp":
        return Eltwise("exp")
    if t == "Log":
        return Eltwise("log")
    if t == "Sqrt":
        return Eltwise("sqrt")
    if t == "Abs":
        return Eltwise("abs")
    if t == "Neg":
        return Eltwise("linear", -1.0, 0.0)
    if t == "HardSigmoid":
        return Eltwise("hardsigmoid", float(op.alpha), float(op.beta))
    if t == "HardSwish":
        return Eltwise("hardswish", 1 / 6, 0.5)
    if t == "Gelu":
        return Eltwise("gelu_tanh" if op.approximate == "tanh" else "gelu_erf")
    if t == "Reciprocal":
        return Eltwise("pow", 1.0, -1.0)
    if t == "Pow":
        # x ** c for a constant scalar c (GPT-2's tanh-GELU exports Pow(x, 3), RMSNorm
        # Pow(x, 2)): oneDNN's pow, alpha * x^beta, forward and backward; a tensor exponent,
        # or one asked a gradient for, stays the operator's
        exponent = ctx.constant(node.inputs[1])
        if exponent is None or exponent.size != 1 or not np.isfinite(exponent).all():
            return None
        return Eltwise("pow", 1.0, float(np.asarray(exponent, np.float64).reshape(())))
    if t == "Clip":
        bounds = clip_bounds(ctx, node, op)
        if bounds is None or bounds[0] > bounds[1]:
            return None
        lo, hi = bounds
        return Eltwise("clip", lo, hi)
    return None


def clip_bounds(ctx: Context, node: Node, op) -> tuple[float, float] | None:
    """Clip's (min, max) when both are known at plan build (opset 6's attributes, or constant
    scalar inputs; an absent one unbounded), else None: the oneDNN clip and the fused
    pointwise groups read them here."""
    if "min" in getattr(op, "attributes", {}):  # opset 6: attributes
        return float(op.min), float(op.max)
    bounds = []
    for i, default in ((1, -np.inf), (2, np.inf)):
        name = node.inputs[i] if len(node.inputs) > i else ""
        if not name:
            bounds.append(default)
            continue
        value = ctx.constant(name)
        if value is None or value.size != 1 or value.dtype.kind not in "fiu":
            return None
        bounds.append(float(np.asarray(value, np.float64).reshape(())))
    return bounds[0], bounds[1]


ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Exp", "Log", "Sqrt", "Abs", "Neg",
               "HardSigmoid", "HardSwish", "Gelu", "Clip", "Reciprocal", "Pow")


def fused_activation(ctx: Context, node: Node, output: str) -> tuple[Node, Eltwise] | None:
    """The activation reading only ``output`` that ``node``'s kernel can apply in its output
    loop; with a backward, only activations whose derivative follows from their output."""
    nxt = ctx.single_consumer(output, ACTIVATIONS)
    if nxt is None:
        return None
    e = eltwise_of(ctx, nxt, ctx.ops[nxt.name])
    if e is None or not ctx.float32(nxt.outputs[0]):
        return None
    if ctx.backprop and (ctx.needs(output)) and not ctx.rt.eltwise_has_dst_form(e.name, e.alpha):
        return None
    if ctx.backprop and ctx.needs(output) and e.name == "relu" and e.alpha:
        return None  # oneDNN's LeakyRelu derivative at 0 is alpha, the operator's 1
    return nxt, e


def activation_backward(pb: PlanBuilder, y: str, g: str, e: Eltwise) -> str:
    """The gradient before a fused activation, from its output's gradient (and output)."""
    v = pb.value(y)
    gz = pb.temp(y)
    dims = list(v.shape) or [1]
    pb.step(f"{e.name} backward", [y, g], [gz],
            lambda a: [pb.rt.eltwise_backward(dims, v.layout, e.name, e.alpha, e.beta, True,
                                              a(y), a(g), a(gz))], "backward")
    return gz


def eltwise(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    e = eltwise_of(ctx, node, op)
    if e is None or not ctx.float32(x, out):
        return None
    if ctx.needs(x) and (e.name in ("abs", "round") or e.name == "relu" and e.alpha):
        return None  # their derivative at 0 differs from the operator's (LeakyRelu's: 1)
    v = pb.value(x)
    layout = v.layout
    dims = list(v.shape) or [1]  # oneDNN has no 0-d tensors: a scalar as one element
    y = pb.output(out, v.shape, F32, layout)
    count = prod(dims)
    if keeps_derivative(ctx, node, e, layout):
        return gelu_keeping_derivative(ctx, node, x, y, count)
    pb.step(node.op_type, [x], [y],
            lambda a: [pb.rt.eltwise(dims, layout, e.name, e.alpha, e.beta, a(x), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")
    use_dst = pb.rt.eltwise_has_dst_form(e.name, e.alpha)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if e.name == "gelu_erf" and layout == "plain":
            # our loop (eltwise.cpp's gelu): oneDNN's gelu_erf backward ran 0.9 ms on
            # 2048 x 512 at 1 thread and did not speed up at 2; this one 0.73 and 0.36
            dest, add = pb.grad_target(x, can_accumulate=True)
            pb.step(f"{node.op_type} backward", [x, g], [dest],
                    lambda a: [pb.rt.gelu(count, a(x), a(g), a(dest), add)], "backward")
            return
        dest, _ = pb.grad_target(x)
        saved = y if use_dst else x
        pb.step(f"{node.op_type} backward", [saved, g], [dest],
                lambda a: [pb.rt.eltwise_backward(dims, layout, e.name, e.alpha, e.beta,
                                                  use_dst, a(saved), a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


def keeps_derivative(ctx: Context, node: Node, e: Eltwise | None, layout: str) -> bool:
    """Whether ``node`` (its activation ``e``) runs as ``gelu_keeping_derivative``: Gelu
    (erf) in training, its plain input read by nothing else."""
    x = node.inputs[0]
    return e is not None and e.name == "gelu_erf" and layout == "plain" and ctx.needs(x) \
        and ctx.consumers.get(x) == [node] and x not in ctx.protected


def gelu_reads_bf16(ctx: Context, node: Node, name: str) -> bool:
    """Whether ``node`` reads its input ``name`` in bf16: a bf16 plan's Gelu kept with its
    derivative whose output it writes in bf16 (``gelu_keeping_derivative``), as autocast's
    GELU reads its bf16 product's output. Entered in ``precision.BF16_READERS``: the product
    before it then writes ``name`` in bf16 only."""
    if not ctx.bf16 or node.op_type != "Gelu" or node.name in ctx.absorbed \
            or node.inputs[0] != name or not ctx.float32(name, node.outputs[0]):
        return False
    e = eltwise_of(ctx, node, ctx.ops[node.name])
    return keeps_derivative(ctx, node, e, "plain") and keeps_bf16(ctx, node.outputs[0])


BF16_READERS.append(gelu_reads_bf16)


def gelu_keeping_derivative(ctx: Context, node: Node, x: str, y: str, count: int) -> Lowered:
    """Gelu (erf) in training when nothing else reads its input: the forward writes y and
    gelu'(x) in one pass (the derivative's bytes replace x's, which nothing keeps), the
    backward is dx = dy * gelu'(x). On 2048 x 512 at 1 thread: 0.76 + 0.25 ms, against
    oneDNN's forward and our backward from x, 0.50 + 0.75. In a bf16 plan where only bf16
    products read y, y and the derivative are written in bf16 (as autocast keeps Gelu's
    input and output in bf16 between its bf16 products), computed in float32; x is then
    read in bf16 where its producer wrote it so (``gelu_reads_bf16``)."""
    pb = ctx.pb
    low = keeps_bf16(ctx, y)  # read by bf16 products only: y and gelu'(x) kept in bf16
    d = pb.output(pb.fresh(f"{y}@derivative"), pb.value(x).shape, BF16 if low else F32)
    y_out = bf16_holder(ctx, y) if low else y
    xs = stored(ctx, x) if low else x
    pb.step(node.op_type, [xs], [y_out, d],
            lambda a: [pb.rt.gelu(count, a(xs), None, a(y_out), False, a(d))])
    if low:
        takes_bf16_gradient(ctx, y)  # dy * gelu'(x) reads dy in bf16

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        g = stored(ctx, g)
        dest, add = gradient_target(ctx, x)
        if low and not add and dest != pb.grad(x) and pb.value(dest).dtype == BF16:
            # dx's bf16 holder (its one contribution) is written over gelu'(x), which only
            # this step reads: dx[i] = dy[i] * d[i] element by element, so no third
            # activation-sized buffer is alive here (4 MiB of the GPT's bf16 step at
            # sequence 256, where the backward's arena peaked)
            pb.view(dest, d, pb.value(dest).shape)
        pb.step(f"{node.op_type} backward", [g, d], [dest],
                lambda a: [pb.rt.multiply(count, a(g), a(d), a(dest), add)], "backward")
    return Lowered(node, backward, "native")


BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}


def broadcast_dims(shape: tuple[int, ...], rank: int) -> list[int]:
    return [1] * (rank - len(shape)) + list(shape)


def reduction(rt, dims: list[int], to: list[int], layout: str, x: np.ndarray, y: np.ndarray):
    """The step summing x (dims, layout) over the dims where ``to`` is 1."""
    kept = [i for i, (d, t) in enumerate(zip(dims, to)) if t != 1 or d == 1]
    if layout == "plain" and kept == list(range(len(dims) - len(kept), len(dims))):
        return rt.column_sum(prod(dims) // prod(to), prod(to), x, y)  # trailing dims kept
    if len(dims) == 4 and to == [1, dims[1], 1, 1]:
        if layout == "nhwc":
            return rt.column_sum(dims[0] * dims[2] * dims[3], dims[1], x, y)
        if layout == "plain":
            return rt.channel_sum(dims[0], dims[1], dims[2] * dims[3], x, y)
    return rt.reduce_sum(dims, to, layout, x, y)


def binary(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    a, b = node.inputs[:2]
    out = node.outputs[0]
    if not ctx.float32(a, b, out):
        return None
    so = ctx.shape(out)
    rank = len(so)
    da, db = broadcast_dims(ctx.shape(a), rank), broadcast_dims(ctx.shape(b), rank)
    alg = BINARY[node.op_type]
    if list(so) != da:  # the full-shape operand must come first
        if list(so) != db or alg in ("sub", "div"):
            return None
        a, b, da, db = b, a, db, da
    if rank == 0:  # oneDNN has no 0-d tensors: scalars as one element
        da = db = [1]
    per_channel = rank == 4 and db == [1, so[1], 1, 1]
    layout = pb.value(a).layout
    if db != da and not per_channel:
        layout = "plain"
    a_in = pb.require_layout(a, layout)
    b_in = pb.require_layout(b, layout) if db == da else pb.require_layout(b, "plain")
    b_layout = pb.value(b_in).layout
    y = pb.output(out, so, F32, layout)
    pb.step(node.op_type, [a_in, b_in], [y],
            lambda x: [pb.rt.binary(da, db, layout, b_layout, alg, x(a_in), x(b_in), x(y))])
    if not (ctx.needs(a) or ctx.needs(b)):
        return Lowered(node, None, "onednn")
    count = pb.value(y).nbytes // 4

    def reduce_into(source: str, target: str, negate: bool) -> None:
        """target (b's dims) = (-)sum of source (output dims) over b's broadcast dims."""
        dest_name, _ = pb.grad_target(target)
        if db == da:
            if negate:
                pb.step("negate", [source], [dest_name],
                        lambda x: [pb.rt.eltwise(da, layout, "linear", -1.0, 0.0, x(source),
                                                 x(dest_name))], "backward")
            else:
                pb.step("copy", [source], [dest_name],
                        lambda x: [pb.rt.copy(x(source), x(dest_name), count)], "backward")
            return
        t = pb.output(pb.fresh(f"{target}@sum"), db) if negate else dest_name
        src_layout = pb.value(source).layout
        pb.step("reduce", [source], [t],
                lambda x: [reduction(pb.rt, da, db, src_layout, x(source), x(t))], "backward")
        if negate:
            pb.step("negate", [t], [dest_name],
                    lambda x: [pb.rt.eltwise(db, "plain", "linear", -1.0, 0.0, x(t),
                                             x(dest_name))], "backward")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if alg in ("add", "sub"):
            # an operand this sum is the only reader of takes dy's bytes as its gradient
            # (a residual branch's output): no copy
            if ctx.needs(a) and not pb.alias_grad(a_in, y):
                dest, add = pb.grad_target(a_in, can_accumulate=True)
                pb.step("copy", [g], [dest], lambda x: [pb.rt.copy(x(g), x(dest), count, add)],
                        "backward")
            if ctx.needs(b) and not (alg == "add" and db == da and pb.alias_grad(b_in, y)):
                reduce_into(g, b_in, alg == "sub")
        elif alg == "mul":
            if ctx.needs(a):  # d full = dy * other
                dest, _ = pb.grad_target(a_in)
                pb.step("mul backward", [g, b_in], [dest],
                        lambda x: [pb.rt.binary(da, db, layout, b_layout, "mul", x(g),
                                                x(b_in), x(dest))], "backward")
            if ctx.needs(b):  # d other = sum(dy * full)
                t = pb.temp(g)
                pb.step("mul backward", [g, a_in], [t],
                        lambda x: [pb.rt.binary(da, da, layout, layout, "mul", x(g), x(a_in),
                                                x(t))], "backward")
                reduce_into(t, b_in, False)
        else:  # div: da = dy / b; db = -sum(dy / b * y)
            t = pb.temp(g)
            pb.step("div backward", [g, b_in], [t],
                    lambda x: [pb.rt.binary(da, db, layout, b_layout, "div", x(g), x(b_in),
                                            x(t))], "backward")
            if ctx.needs(a):
                dest, add = pb.grad_target(a_in, can_accumulate=True)
                pb.step("copy", [t], [dest], lambda x: [pb.rt.copy(x(t), x(dest), count, add)],
                        "backward")
            if ctx.needs(b):
                u = pb.temp(g)
                pb.step("div backward", [t, y], [u],
                        lambda x: [pb.rt.binary(da, da, layout, layout, "mul", x(t), x(y),
                                                x(u))], "backward")
                reduce_into(u, b_in, True)
    return Lowered(node, backward, "onednn")


def sum_node(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    xs = [x for x in node.inputs if x]
    out = node.outputs[0]
    if not xs or not ctx.float32(*xs, out) or any(ctx.shape(x) != ctx.shape(out) for x in xs):
        return None
    if len(xs) == 1:
        return None
    layout = pb.value(xs[0]).layout
    ins = [pb.require_layout(x, layout) for x in xs]
    y = pb.output(out, ctx.shape(out), F32, layout)
    dims = list(ctx.shape(out)) or [1]  # oneDNN has no 0-d tensors: a scalar as one element
    pb.step("Sum", ins, [y],
            lambda a: [pb.rt.sum(dims, layout, [1.0] * len(ins), [a(x) for x in ins], a(y))])
    if not any(ctx.needs(x) for x in xs):
        return Lowered(node, None, "onednn")
    count = pb.value(y).nbytes // 4

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        for x in ins:
            if ctx.needs(x):
                dest, add = pb.grad_target(x, can_accumulate=True)
                pb.step("copy", [g], [dest], lambda a, d=dest, ad=add: [
                    pb.rt.copy(a(g), a(d), count, ad)], "backward")
    return Lowered(node, backward, "onednn")


def reduce_mean(ctx: Context, node: Node, op) -> Lowered | None:
    """ReduceMean / ReduceSum over a run of adjacent axes."""
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not shape or not ctx.float32(x, out):
        return None
    axes = getattr(op, "axes", None)
    if len(node.inputs) > 1 and node.inputs[1]:
        given = ctx.constant(node.inputs[1])
        if given is None:
            return None
        axes = [int(a) for a in given.reshape(-1)]
    if not axes:
        if getattr(op, "noop_with_empty_axes", 0):
            return None
        axes = list(range(len(shape)))
    axes = sorted(int(a) % len(shape) for a in axes)
    if axes != list(range(axes[0], axes[-1] + 1)):
        return None
    outer, mid = prod(shape[:axes[0]]), prod(shape[axes[0]:axes[-1] + 1])
    inner = prod(shape[axes[-1] + 1:])
    scale = 1.0 / mid if node.op_type == "ReduceMean" else 1.0
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, ctx.shape(out))
    pb.step(node.op_type, [xin], [y],
            lambda a: [pb.rt.reduce_mid(outer, mid, inner, scale, a(xin), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, add = pb.grad_target(xin, can_accumulate=True)
        pb.step(f"{node.op_type} backward", [g], [dest],
                lambda a: [pb.rt.broadcast_mid(outer, mid, inner, scale, a(g), a(dest), add)],
                "backward")
    return Lowered(node, backward, "native")
