"""Convolution lowering: oneDNN's convolution with fused post-ops (an eval-mode BatchNorm as a
per-channel scale and shift, a residual addition into the output, an activation), its
weights reordered into the kernel's layouts. C++ side: cpp/plan/conv.cpp.

In a bf16 plan (``Context.bf16``) the convolution reads bf16 as autocast's does, and reads
each activation's one bf16 copy (``bf16_activation``): the input's, shared by the forward
and the weights' gradient, and the output gradient's, shared by both backward products; an
input the op before wrote in bf16 only (a BatchNorm+ReLU read only by convolutions: this
module enters ``reads_bf16`` in ``precision.BF16_READERS``) is read where it lies. The
output is written in bf16 when every reader reads it so (a training BatchNorm:
``lowering.norm.reads_bf16``), and that reader may hand back its gradient in bf16."""

from __future__ import annotations

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.eltwise import activation_backward, fused_activation
from meta.lv1.plan.lowering.norm import dense_bf16, per_channel_chain
from meta.lv1.plan.memory import root
from meta.lv1.plan.precision import (
    BF16_READERS,
    COPIES,
    bf16_holder,
    bf16_operand,
    keeps_bf16,
    stored,
    takes_bf16_gradient,
)

# Layouts a convolution is tried in, in order; the first whose kernels are all optimised wins.
CONV_LAYOUTS = ("nhwc", "nChw16c", "any", "plain")


def lowers(ctx: Context, node: Node) -> bool:
    """Whether ``conv`` lowers this Conv (2-D, float32 operands)."""
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    return len(ctx.shape(x)) == 4 and ctx.float32(x, w, b, node.outputs[0])


def reads_bf16(ctx: Context, node: Node, name: str) -> bool:
    """Whether this lowering reads ``name`` as the bf16 input of a bf16 plan's convolution
    (never its weights or bias): its producer may write it in bf16 only."""
    return (ctx.bf16 and node.op_type == "Conv" and node.name not in ctx.absorbed
            and node.inputs[0] == name and list(node.inputs).count(name) == 1
            and lowers(ctx, node))


BF16_READERS.append(reads_bf16)


def bf16_activation(ctx: Context, name: str, phase: str) -> str:
    """The bf16 value a convolution reads for the activation ``name``: its bf16 holder or copy
    (``precision.bf16_operand``), or for a channels-last one, which that leaves to the kernel,
    a copy converted once here (channels-last is as dense as plain: one conversion element
    by element keeps the layout) and kept for every later reader."""
    pb = ctx.pb
    v = pb.value(name)
    copies = ctx.objects.setdefault(COPIES, {})
    if v.layout != "nhwc" or v.dtype != F32 or name in copies:
        return bf16_operand(ctx, name, phase)
    copy = dense_bf16(pb, pb.fresh(f"{name}@bf16"), v.shape, v.layout)
    n = int(np.prod(v.shape))
    pb.step("to bf16", [name], [copy], lambda a: [pb.rt.convert(a(name), a(copy), n)], phase)
    copies[name] = copy
    return copy


def conv(ctx: Context, node: Node, op) -> Lowered | None:
    pb, rt = ctx.pb, ctx.rt
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    if not lowers(ctx, node):
        return None
    win = op.window(np.broadcast_to(F32.type(0), ctx.shape(x)),
                    np.broadcast_to(F32.type(0), ctx.shape(w)),
                    np.broadcast_to(F32.type(0), ctx.shape(b)) if b else None)
    out = node.outputs[0]
    post: list[tuple[str, str, float, float]] = []
    absorbed: list[Node] = []
    bn_inputs: list[str] = []
    last = out
    # eval-mode BatchNormalization folded in as a per-channel scale and shift
    bn = ctx.single_consumer(out, ("BatchNormalization",))
    then: list[tuple[str, str]] = []
    if bn is not None and not ctx.backprop and bn_eval(ctx, bn):
        bn_inputs = list(bn.inputs[1:5])
        post.append(("scale_shift", "", 0.0, 0.0))
        absorbed.append(bn)
        then, last = per_channel_chain(ctx, node, node, bn.outputs[0], 4)
    # inference: a residual addition into the output (written over the residual's bytes)
    before_residual = last
    residual, add = (residual_of(ctx, node, last) if not ctx.backprop and (bn is None or absorbed)
                     else (None, None))
    if add is not None:
        post.append(("sum", "", 0.0, 0.0))
        last = add.outputs[0]
    act = fused_activation(ctx, node, last) if (bn is None or absorbed) else None
    if act is not None:
        nxt, e = act
        post.append(("eltwise", e.name, e.alpha, e.beta))
        last = nxt.outputs[0]
    need_dx = ctx.needs(x)
    need_dw = ctx.needs(w) or ctx.needs(b)
    current = pb.value(x).layout
    tried = [current] if current not in ("plain",) else []
    if residual is not None:
        tried = [pb.value(residual).layout, *tried]
    layouts = (*tried, *CONV_LAYOUTS)
    if stored(ctx, x) != x:  # written in bf16 only: read in the layout it was written in
        layouts = (current,)
    # bf16 output: every reader reads it in bf16 (a training BatchNorm), no residual shares it
    low_out = residual is None and not post and keeps_bf16(ctx, last)

    def make(post, low_out=False):
        kernel = None
        for layout in layouts:
            k = rt.Conv(list(ctx.shape(x)), list(ctx.shape(w)), bool(b), list(win.strides),
                        list(win.pads_begin), list(win.pads_end), list(win.dilations),
                        int(op.group), post, ctx.backprop and (need_dx or need_dw), need_dx,
                        need_dw, layout, ctx.bf16, low_out)
            if "ref:" not in k.info and k.src_layout and k.dst_layout:
                return k
            kernel = kernel or k
        return kernel

    k = make(post, low_out)
    if low_out and k.dst_layout not in ("nhwc", "plain"):  # a bf16 tensor is kept dense
        low_out = False
        k = make(post)
    if residual is not None and k.dst_layout != pb.value(residual).layout:  # cannot share
        post.remove(("sum", "", 0.0, 0.0))
        residual = add = None
        if act is not None:  # it came after the addition
            post.remove(("eltwise", act[1].name, act[1].alpha, act[1].beta))
            act = None
        last = before_residual
        k = make(post)
    if add is not None:
        absorbed.append(add)
    if act is not None:
        absorbed.append(act[0])
    ctx.kernels.append(k)
    for n in absorbed:
        ctx.absorb(node, n)
    xin = pb.require_layout(x, k.src_layout)
    # bf16: the input's one bf16 copy (or the bf16 it was written in), read forward and by dW
    x16 = bf16_activation(ctx, xin, "forward") if ctx.bf16 else xin
    if residual is not None:  # the residual's bytes become the output
        y = pb.view(last, residual, ctx.shape(last))
    else:
        y = pb.output(last, ctx.shape(last), F32, k.dst_layout)
    y_out = y
    if low_out:  # y declared, its bytes written in bf16 only
        y_out = bf16_holder(ctx, y)
        pb.values[y_out].layout = k.dst_layout
        takes_bf16_gradient(ctx, y)  # both backward products read dy in bf16
    reads = [x16, w, b, residual or ""]
    post_args: list[str] = []
    if bn_inputs:
        scale = pb.output(pb.fresh(f"{bn.name}.scale"), ctx.shape(bn_inputs[0]))
        shift = pb.output(pb.fresh(f"{bn.name}.shift"), ctx.shape(bn_inputs[0]))
        gamma, beta, mean, var = bn_inputs
        eps = float(ctx.ops[bn.name].epsilon)
        c = ctx.shape(gamma)[0]
        pb.step("batchnorm fold", [*bn_inputs, *(name for _, name in then)], [scale, shift],
                lambda a: [rt.affine_fold(a(gamma), a(beta), a(mean), a(var), eps,
                                          [(kind, a(name)) for kind, name in then], a(scale),
                                          a(shift), c)])
        post_args = [scale, shift]
    wf = weights_in_layout(ctx, k, "forward", w, "forward")
    pb.step("conv", [*reads, *post_args, wf], [y_out],
            lambda a: [k.forward(a(x16), a(w), a(b) if b else None, a(y_out),
                                 [a(p) for p in post_args], a(wf) if wf else None)])
    kind = "onednn bf16" if ctx.bf16 else "onednn"
    if not (need_dx or need_dw):
        return Lowered(node, None, kind)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        if ctx.bf16:  # dy's one bf16 copy (or its bf16 holder), read by both products
            g = bf16_activation(ctx, g, "backward")
        if need_dx:
            dest, _ = pb.grad_target(xin)
            wb = weights_in_layout(ctx, k, "backward_data", w, "backward",
                                   wf if ctx.bf16 else "")
            pb.step("conv backward data", [g, w, wb], [dest],
                    lambda a: [k.backward_data(a(g), a(w), a(dest), a(wb) if wb else None)],
                    "backward")
        if need_dw:
            tw = pb.grad_target(w) if ctx.needs(w) else None
            tb = pb.grad_target(b) if ctx.needs(b) else None
            dw = tw[0] if tw else pb.temp(w)
            db = (tb[0] if tb else pb.temp(b)) if b else ""
            # the direct kernel's gradient in its layout, or the bf16 columns of the small
            # outputs' im2col + product (``k.gemm_dw``, cpp/plan/conv.cpp)
            size = k.dw_workspace_bytes()
            dwk = pb.output(pb.fresh(f"{w}@diff_layout"), (-(-size // 4),)) if size else ""
            pb.step("conv backward weights", [x16, g], [dw, db, dwk],
                    lambda a: list(k.backward_weights(a(x16), a(g), a(dw),
                                                      a(db) if db else None,
                                                      a(dwk) if dwk else None)), "backward")
    return Lowered(node, backward, kind)


def weights_in_layout(ctx: Context, k, which: str, w: str, phase: str,
                      forward_copy: str = "") -> str:
    """The buffer holding ``w`` in kernel ``k``'s ``which`` layout ("" when ``w`` already is
    that layout). Training: an arena value, filled by a reorder just before its use, so it
    lives only that long (the weights change every step). Inference: an array of the plan's,
    filled by the prepare program, which runs again only when the weights change.

    ``forward_copy``: the forward's buffer of ``w`` (a bf16 plan's backward data), reordered
    from instead of the float32 ``w``: the same bf16 bits, half the bytes read (the forward's
    copy then lives until the backward)."""
    size = k.weights_bytes(which)
    if not size:
        return ""
    pb = ctx.pb
    buf = pb.output(pb.fresh(f"{w}@{which}"), (-(-size // 4),))  # bf16: half as many bytes
    if not ctx.backprop:
        pb.values[buf].storage = "owned"
        phase = "prepare"
    if forward_copy:
        pb.step(f"conv weights -> {which} layout", [forward_copy], [buf],
                lambda a: [k.reorder_weights_from("forward", a(forward_copy), which, a(buf))],
                phase)
    else:
        pb.step(f"conv weights -> {which} layout", [w], [buf],
                lambda a: [k.reorder_weights(which, a(w), a(buf))], phase)
    return buf


def residual_of(ctx: Context, node: Node, output: str) -> tuple[str | None, Node | None]:
    """(r, the Add) when ``output``'s one reader adds it to a tensor r computed earlier that
    nothing reads later and that lives in the arena: the convolution may then add into r's
    bytes (oneDNN's sum post-op) instead of writing its own and adding after."""
    add = ctx.single_consumer(output, ("Add", "Sum"), first=False)
    if add is None or len([x for x in add.inputs if x]) != 2 or not ctx.float32(*add.inputs):
        return None, None
    r = add.inputs[1] if add.inputs[0] == output else add.inputs[0]
    values = ctx.pb.values
    if r not in values or r in ctx.protected or r == output \
            or ctx.shape(r) != ctx.shape(output) or ctx.shape(add.outputs[0]) != ctx.shape(r):
        return None, None

    base = root(values, r)
    if values[base].storage != "arena":
        return None, None
    sharing = [n for n in values if root(values, n) == base]  # r and every other view of its bytes
    for name in sharing:
        if name in ctx.protected:
            return None, None
        # read by the convolution itself, or later: its bytes are still needed
        if any(c is not add and ctx.order.get(c.name, -1) >= ctx.order[node.name]
               for c in ctx.consumers.get(name, [])):
            return None, None
    return r, add


def bn_eval(ctx: Context, node: Node) -> bool:
    """Whether a BatchNormalization runs with its stored statistics, all float32, only Y used."""
    op = ctx.ops[node.name]
    if ctx.mode(bool(getattr(op, "training_mode", 0))):
        return False
    if any(o for o in node.outputs[1:] if ctx.consumers.get(o) or o in ctx.protected):
        return False
    return len(node.inputs) >= 5 and ctx.float32(*node.inputs[:5])
