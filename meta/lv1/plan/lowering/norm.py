"""Normalization lowerings: BatchNormalization (training with batch statistics, eval-mode as
one per-channel affine pass) and LayerNormalization, forward and backward. C++ side:
cpp/plan/norm.cpp (and eltwise.cpp's affine_fold). In a bf16 plan a LayerNorm read only by
bf16 products writes its output in bf16 (``precision.keeps_bf16``); its statistics and
backward stay float32.

A training BatchNormalization in a bf16 plan keeps a CNN's activations in bf16 between its
convolutions, as autocast's bf16 batch normalization does: it reads its input in bf16 where
the convolution wrote it so (it enters ``reads_bf16`` in ``precision.BF16_READERS``; its
backward reads the same bf16 input), writes its output (+ReLU) in bf16 when only bf16
convolutions read it, and hands its input's gradient to the convolution in bf16 where that
one reads it so (``precision.gradient_target``); statistics, sums and the per-channel
arithmetic stay float32 (double sums). There it also takes in a ResNet block's end,
relu(bn(x) + r) (``residual_add``: autocast's bf16 Add and ReLU, one pass here), so the
residual stream between blocks is bf16 too: the residual Add is entered as a bf16 reader of
r (``residual_reads_bf16``)."""

from __future__ import annotations

from math import prod

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.eltwise import broadcast_dims, fused_activation
from meta.lv1.plan.precision import (
    BF16,
    BF16_READERS,
    bf16_holder,
    gradient_target,
    keeps_bf16,
    stored,
)


def dense_bf16(pb: PlanBuilder, name: str, shape, layout: str) -> str:
    """A bf16 value ``name`` in ``layout``, plain or channels-last: both dense, two bytes an
    element (``PlanBuilder.output`` sizes a non-plain layout as float32's)."""
    pb.output(name, shape, BF16)
    pb.values[name].layout = layout
    return name


def bn_lowers(ctx: Context, node: Node) -> bool:
    """Whether ``batchnorm`` lowers this BatchNormalization in training, by meta's loops."""
    op = ctx.ops[node.name]
    if len(node.inputs) < 5 or not ctx.mode(bool(getattr(op, "training_mode", 0))):
        return False
    x = node.inputs[0]
    return (ctx.float32(*node.inputs[:5], node.outputs[0]) and len(ctx.shape(x)) >= 2
            and bool(prod(ctx.shape(x)))
            and not any(o for o in node.outputs[1:] if ctx.consumers.get(o) or o in ctx.protected))


def reads_bf16(ctx: Context, node: Node, name: str) -> bool:
    """Whether a bf16 plan's training BatchNormalization reads ``name`` as its bf16 input (a
    4-D activation; never its parameters): the convolution before may write it in bf16 only."""
    return (ctx.bf16 and node.op_type == "BatchNormalization" and node.name not in ctx.absorbed
            and node.inputs[0] == name and list(node.inputs).count(name) == 1
            and len(ctx.shape(name)) == 4 and bn_lowers(ctx, node))


BF16_READERS.append(reads_bf16)


def producer(ctx: Context, name: str) -> Node | None:
    """The node writing ``name`` (a map made once per plan, from who reads what)."""
    made = ctx.objects.get("producers")
    if made is None:
        made = {o: n for readers in ctx.consumers.values() for n in readers for o in n.outputs}
        ctx.objects["producers"] = made
    return made.get(name)


def residual_add(ctx: Context, node: Node) -> tuple[Node | None, Node | None, str]:
    """(the Add, the ReLU after it, r) when a bf16 plan's training BatchNorm's output is added
    to a tensor r of its shape that an earlier node computes, and only a ReLU reads the sum:
    a ResNet block's end, relu(bn(x) + r), which the BatchNorm then computes in one pass."""
    none = (None, None, "")
    out = node.outputs[0]
    if not ctx.bf16 or len(ctx.shape(out)) != 4 or not bn_lowers(ctx, node):
        return none
    add = ctx.single_consumer(out, ("Add",), first=False)
    if add is None:
        return none
    inputs = [i for i in add.inputs if i]
    if len(inputs) != 2 or inputs[0] == inputs[1]:
        return none
    r = inputs[1] if inputs[0] == out else inputs[0]
    relu = ctx.single_consumer(add.outputs[0], ("Relu",))
    made = producer(ctx, r)
    if relu is None or made is None or ctx.order.get(made.name, -1) >= ctx.order[node.name] \
            or ctx.shape(r) != ctx.shape(out) or ctx.shape(add.outputs[0]) != ctx.shape(out) \
            or not ctx.float32(r, add.outputs[0], relu.outputs[0]) or r in ctx.protected:
        return none
    return add, relu, r


def residual_reads_bf16(ctx: Context, node: Node, name: str) -> bool:
    """Whether ``node`` is a residual Add that a BatchNorm takes in (``residual_add``) with
    ``name`` as its r: that BatchNorm reads r in bf16 where it is kept so."""
    if not ctx.bf16 or node.op_type != "Add" or node.name in ctx.absorbed:
        return False
    inputs = [i for i in node.inputs if i]
    if len(inputs) != 2 or name not in inputs or inputs[0] == inputs[1]:
        return False
    bn = producer(ctx, inputs[1] if inputs[0] == name else inputs[0])
    if bn is None or bn.op_type != "BatchNormalization" or bn.name in ctx.absorbed:
        return False
    add, _, r = residual_add(ctx, bn)
    return add is node and r == name


BF16_READERS.append(residual_reads_bf16)


def batchnorm(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    if len(node.inputs) < 5:
        return None
    x, scale, bias, mean, var = node.inputs[:5]
    out = node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) < 2 or not ctx.float32(x, scale, bias, mean, var, out) or not prod(shape):
        return None
    if any(o for o in node.outputs[1:] if ctx.consumers.get(o) or o in ctx.protected):
        return None
    training = ctx.mode(bool(getattr(op, "training_mode", 0)))
    backward_needed = any(ctx.needs(v) for v in (x, scale, bias))
    if backward_needed and not training:
        return None  # a backward through stored statistics: the operator's own code
    layout = pb.value(x).layout if len(shape) == 4 else "plain"
    if not training:
        return affine(ctx, node, op, layout)
    # Training runs meta's loops, which sum in double (cpp/plan/norm.cpp says why), on the
    # plain or the channels-last layout: a blocked one is reordered to channels-last.
    if layout not in ("plain", "nhwc"):
        layout = "nhwc"
    # bf16 plan: the input as the convolution wrote it (in bf16 only, in a dense layout)
    xin = stored(ctx, x) if ctx.bf16 else x
    if xin == x:
        xin = pb.require_layout(x, layout)
    relu = ctx.single_consumer(out, ("Relu",))
    if relu is not None and not ctx.float32(relu.outputs[0]):
        relu = None
    add, r = None, ""
    if relu is None:  # a bf16 plan's ResNet block end: relu(bn(x) + r) in one pass
        add, relu, r = residual_add(ctx, node)
    r_in = stored(ctx, r) if r else ""
    if r and pb.value(r).layout != layout:
        if r_in != r:
            raise AssertionError(f"{node.name}: residual {r!r} kept in bf16 in layout "
                                 f"{pb.value(r).layout}, the BatchNorm runs {layout}")
        r_in = pb.require_layout(r, layout)
    k = ctx.rt.BatchNorm(list(shape), layout, float(op.epsilon), float(op.momentum), training,
                         relu is not None)
    ctx.kernels.append(k)
    last = out
    for n in (add, relu):
        if n is not None:
            ctx.absorb(node, n)
            last = n.outputs[0]
    y = pb.output(last, shape, F32, layout)
    y_out = y
    if keeps_bf16(ctx, last):  # read by bf16 convolutions (and residual adds) only: bf16
        y_out = bf16_holder(ctx, y)
        pb.values[y_out].layout = layout
    pb.step("BatchNormalization", [xin, scale, bias, mean, var, r_in], [y_out],
            lambda a: [k.forward(a(xin), a(scale), a(bias), a(mean), a(var), a(y_out),
                                 a(r_in) if r_in else None)])
    if training and mean in ctx.state and var in ctx.state:
        pb.step("running statistics", [mean, var], [mean, var],
                lambda a: [k.update(a(mean), a(var))])
    if not backward_needed:
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        low_in = xin != x and pb.value(xin).dtype == BF16
        dx, ds, db = norm_gradients(pb, ctx, x, x if low_in else xin, scale, bias, low_in)
        g = stored(ctx, g)
        if not r:
            pb.step("BatchNormalization backward", [xin, g, scale, bias], [dx, ds, db],
                    lambda a: [k.backward(a(xin), a(g), a(scale), a(dx), a(ds) if ds else None,
                                          a(db) if db else None, a(bias))], "backward")
            return
        # relu(bn(x) + r): dy masked by y > 0 is also r's gradient (added where r has more)
        target = pb.grad_target(r, can_accumulate=True) if ctx.needs(r) else None
        dr, add_r = target if target else (pb.temp(y), False)
        pb.step("BatchNormalization backward", [xin, g, scale, bias, y_out,
                                                *([dr] if add_r else [])], [dx, ds, db, dr],
                lambda a: [k.backward(a(xin), a(g), a(scale), a(dx), a(ds) if ds else None,
                                      a(db) if db else None, a(bias), a(y_out), a(dr),
                                      add_r)], "backward")
    return Lowered(node, backward, "native")


def per_channel_chain(ctx: Context, into: Node, node: Node, last: str, rank: int
                      ) -> tuple[list[tuple[str, str]], str]:
    """The per-channel multiplications and additions reading ``last`` one after another (by
    vectors computed before: constants or learned), absorbed into ``into``: [(kind, vector)]
    and the last output."""
    pb = ctx.pb
    channels = ctx.shape(last)[1]
    per_channel = [1, channels] + [1] * (rank - 2)
    then: list[tuple[str, str]] = []
    while True:
        nxt = ctx.single_consumer(last, ("Mul", "Add"), first=False)
        if nxt is None or len([i for i in nxt.inputs if i]) != 2:
            break
        other = nxt.inputs[1] if nxt.inputs[0] == last else nxt.inputs[0]
        v = pb.values.get(other)  # a constant or a learned vector, computed before
        if v is None or v.dtype != F32 or v.layout != "plain" or \
                broadcast_dims(v.shape, rank) != per_channel:
            break
        then.append(("mul" if nxt.op_type == "Mul" else "add", other))
        ctx.absorb(into, nxt)
        last = nxt.outputs[0]
    return then, last


def norm_gradients(pb: PlanBuilder, ctx: Context, x: str, xin: str, scale: str, bias: str,
                   low: bool = False) -> tuple[str, str, str]:
    """Where a normalization's backward writes d(x), d(scale), d(bias): their gradients, or
    a temporary for d(x) (the kernel computes it anyway) and "" for the others, when no
    gradient is wanted. ``xin`` is the value the kernel read for ``x``. ``low``: the kernel
    read ``x`` in bf16 only, and d(x) is written in bf16 where the convolution that wrote
    ``x`` reads its gradient so and this is its one contribution
    (``precision.gradient_target``), in ``x``'s layout."""
    if low and ctx.needs(x) and pb.consumers.get(x) == 1 and pb.grad(x) is None:
        tx = gradient_target(ctx, x)
        if tx is not None and pb.value(tx[0]).dtype == BF16:
            pb.values[tx[0]].layout = pb.value(x).layout
    else:
        tx = pb.grad_target(xin) if ctx.needs(x) else None
    ts = pb.grad_target(scale) if ctx.needs(scale) else None
    tb = pb.grad_target(bias) if bias and ctx.needs(bias) else None
    return (tx[0] if tx else pb.temp(xin)), (ts[0] if ts else ""), (tb[0] if tb else "")


def affine(ctx: Context, node: Node, op, layout: str) -> Lowered:
    """An eval-mode BatchNormalization as one pass: y = act(x * scale + shift) per channel,
    absorbing the per-channel constant multiplications and additions after it (densenet
    writes its BatchNorm's scale and shift that way) and an activation; the scale and shift
    are folded from the statistics on every call (a few values per channel)."""
    pb = ctx.pb
    x, gamma, beta, mean, var = node.inputs[:5]
    shape = ctx.shape(x)
    channels = shape[1]
    per_channel = [1, channels] + [1] * (len(shape) - 2)
    then, last = per_channel_chain(ctx, node, node, node.outputs[0], len(shape))
    post = [("binary", "add", 0.0, 0.0)]
    act = fused_activation(ctx, node, last)
    if act is not None:
        ctx.absorb(node, act[0])
        last = act[0].outputs[0]
        post.append(("eltwise", act[1].name, act[1].alpha, act[1].beta))
    eps = float(op.epsilon)
    scale = pb.output(pb.fresh(f"{node.name}.scale"), (channels,))
    shift = pb.output(pb.fresh(f"{node.name}.shift"), (channels,))
    pb.step("batchnorm fold", [gamma, beta, mean, var, *(name for _, name in then)],
            [scale, shift],
            lambda a: [pb.rt.affine_fold(a(gamma), a(beta), a(mean), a(var), eps,
                                         [(kind, a(name)) for kind, name in then],
                                         a(scale), a(shift), channels)])
    y = pb.output(last, shape, F32, layout)
    pb.step("BatchNormalization", [x, scale, shift], [y],
            lambda a: [pb.rt.binary(list(shape), per_channel, layout, "plain", "mul", a(x),
                                    a(scale), a(y), post, [a(shift)], [per_channel])])
    return Lowered(node, None, "onednn")


def in_place(pb: PlanBuilder, dy: str, dx: str) -> None:
    """Let LayerNorm's backward write d(x) over its dy (oneDNN's layer normalization backward
    computes in place, diff_src = diff_dst): dy is the gradient of the LayerNorm's output,
    which only this step reads, and d(x) a gradient or temporary just made for this step. No
    second activation-sized gradient is then alive here: the last LayerNorm's backward was
    where the bf16 GPT step's arena peaked (its dy and d(x), 2 MiB each at sequence 256)."""
    v, d = pb.values[dy], pb.values[dx]
    if v.storage == "arena" and d.storage == "arena" and v.layout == d.layout == "plain" \
            and v.dtype == d.dtype == F32 and v.nbytes == d.nbytes \
            and not any(w.storage == "view" and w.base == dx for w in pb.values.values()):
        pb.view(dx, dy, d.shape)


def layernorm(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    shape = ctx.shape(x)
    axis = int(op.axis) % len(shape) if shape else 0
    if not ctx.float32(x, scale, bias, out) or any(o for o in node.outputs[1:]):
        return None
    inner = shape[axis:]
    if ctx.shape(scale) != inner or (bias and ctx.shape(bias) != inner):
        return None
    rows, cols = prod(shape[:axis]), prod(inner)
    train = any(ctx.needs(v) for v in (x, scale, bias))
    low = keeps_bf16(ctx, out)  # read by bf16 products only: written in bf16 (float32 stats)
    k = ctx.rt.LayerNorm(rows, cols, float(op.epsilon), train, bool(bias), low)
    ctx.kernels.append(k)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, shape)
    y_out = bf16_holder(ctx, y) if low else y
    pb.step("LayerNormalization", [xin, scale, bias], [y_out],
            lambda a: [k.forward(a(xin), a(scale), a(bias) if bias else None, a(y_out))])
    if not train:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dx, ds, db = norm_gradients(pb, ctx, x, xin, scale, bias)
        in_place(pb, g, dx)
        pb.step("LayerNormalization backward", [xin, g, scale, bias], [dx, ds, db],
                lambda a: [k.backward(a(xin), a(g), a(scale), a(bias) if bias else None, a(dx),
                                      a(ds) if ds else None,
                                      a(db) if db else None)], "backward")
    return Lowered(node, backward, "onednn")
