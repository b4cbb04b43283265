"""How each node becomes steps of a plan.

``lower(context, node)`` picks the node's kernel from ``KERNELS`` (op type -> a function that
returns a ``Lowered`` node, or None when it does not take this case: another dtype, a rank or
an attribute it does not cover) and otherwise runs the operator's own Python code in one step
(``python_node``): every node runs, the kernels make the common ones fast. The kernels
(oneDNN through ``meta._plan``) work in float32; 4-D activations stay in the layout the
convolutions chose (channels-last for most) through pooling, normalization, activations,
additions and concatenations, and are reordered to plain row-major only where a node needs it.

Fusions, decided here because only here is it known what the kernels can absorb:
Conv/Gemm + the activation after it (ReLU, Clip as ReLU6, LeakyRelu, Sigmoid, Tanh, Elu, and
in inference any oneDNN activation), Conv + an eval-mode BatchNormalization (+ activation)
as a per-channel scale and shift applied in the convolution's output loop,
BatchNormalization + ReLU, and views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout
in inference) that cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Callable

import numpy as np

from meta.lv0 import Context as OpContext
from meta.lv0 import InferenceContext, check_backward
from meta.lv1.graph import Node
from meta.lv1.plan import custom
from meta.lv1.plan.builder import Lowered, PlanBuilder

F32 = np.dtype(np.float32)
# Layouts a convolution is tried in, in order; the first whose kernels are all optimised wins.
CONV_LAYOUTS = ("nhwc", "nChw16c", "any", "plain")


def py_step(fn: Callable[[], None], name: str):
    from meta.lv1.plan.runtime import module

    return module().PyStep(fn, name)


@dataclass
class Context:
    """What kernels see besides the builder: the operators, who reads what, the names that
    must exist as themselves (fetched outputs, feeds), the mode."""

    pb: PlanBuilder
    ops: dict
    consumers: dict[str, list[Node]]
    protected: set[str]
    absorbed: set[str]
    training: bool | None
    backprop: bool
    traced: dict = field(default_factory=dict)
    state: set[str] = field(default_factory=set)  # state arrays a training forward updates
    static: set[str] = field(default_factory=set)  # constants and folded values
    order: dict[str, int] = field(default_factory=dict)  # node -> its place in the plan
    fused_into: dict[str, list[str]] = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    objects: dict = field(default_factory=dict)

    @property
    def rt(self):
        return self.pb.rt

    def single_consumer(self, name: str, op_types, first: bool = True) -> Node | None:
        """The one node reading ``name`` if it is of ``op_types`` and ``name`` is needed by
        nothing else (not fetched, not fed): a candidate to fuse."""
        readers = self.consumers.get(name, [])
        if name in self.protected or len(readers) != 1 or readers[0].op_type not in op_types:
            return None
        node = readers[0]
        if node.name in self.absorbed or first and node.inputs[0] != name:
            return None
        return node

    def used(self, name: str) -> bool:
        """Whether anything reads ``name`` or the caller fetches it."""
        return bool(name) and (bool(self.consumers.get(name)) or name in self.protected)

    def absorb(self, into: Node, node: Node) -> None:
        self.absorbed.add(node.name)
        self.fused_into.setdefault(into.name, []).append(node.name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.traced[name].shape)

    def dtype(self, name: str) -> np.dtype:
        return self.traced[name].dtype

    def float32(self, *names: str) -> bool:
        return all(self.dtype(n) == F32 for n in names if n)

    def needs(self, name: str) -> bool:
        return self.backprop and bool(name) and name in self.pb.requires

    def mode(self, as_written: bool) -> bool:
        return as_written if self.training is None else self.training

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a folded or constant input (None when it varies)."""
        if name in self.static:
            return self.traced[name]
        return None


def lower(ctx: Context, node: Node) -> Lowered:
    kernel = KERNELS.get(node.op_type)
    if kernel is not None:
        lowered = kernel(ctx, node, ctx.ops[node.name])
        if lowered is not None:
            return lowered
    return custom.lower(ctx, node) or python_node(ctx, node)


# -- the operator's own code, one step ---------------------------------------------------------
def python_node(ctx: Context, node: Node) -> Lowered:
    """Forward and backward of ``node`` as its operator computes them (numpy, or meta's native
    twin), on plain arrays of the plan; its context is kept for the backward."""
    from meta.lv1.executor import ExecutionError

    pb, op = ctx.pb, ctx.ops[node.name]
    ins = [pb.require_layout(x, "plain") if x else "" for x in node.inputs]
    outs = list(node.outputs)
    for o in outs:
        if o:
            pb.output(o, ctx.shape(o), ctx.dtype(o))
    training = ctx.training
    needs = [bool(x) and ctx.needs(x) and i not in op.no_grad_inputs
             for i, x in enumerate(node.inputs)]
    record = ctx.backprop and any(needs)
    updates = [i for i, x in enumerate(node.inputs) if x in ctx.state and i in op.state_inputs]
    slot: dict = {}

    def build(a):
        arrays = [a(x) if x else None for x in ins]
        targets = [a(o) if o else None for o in outs]
        state = [(i, a(node.inputs[i])) for i in updates]

        def run() -> None:
            c = OpContext(needs, training) if record or updates else \
                InferenceContext(training=training)
            try:
                results = op.apply(c, *arrays)
            except Exception as err:
                shapes = ", ".join(f"{x or '-'}: {getattr(v, 'dtype', '')}"
                                   f"{list(np.shape(v)) if v is not None else 'absent'}"
                                   for x, v in zip(node.inputs, arrays))
                raise ExecutionError(f"{node.describe()} failed on inputs ({shapes}): {err}") \
                    from err
            for name, result, target in zip(outs, results, targets):
                if target is None:
                    continue
                if np.shape(result) != target.shape:
                    raise ExecutionError(
                        f"{node.describe()}: output {name!r} has shape {list(np.shape(result))} "
                        f"where the plan traced {list(target.shape)} (a shape that depends on "
                        f"the data cannot be planned)")
                np.copyto(target, result, casting="unsafe")
            if updates:
                new = op.update_state(c, *(array for _, array in state))
                if new is not None:
                    for (_, array), value in zip(state, new):
                        array[...] = value
            slot["ctx"] = c
        return [py_step(run, node.name)]

    pb.step(node.op_type, ins, [o for o in outs if o], build)
    if not record:
        return Lowered(node, None, "python")

    def backward(pb: PlanBuilder) -> None:
        grads = [pb.grad(o) if o else None for o in outs]
        if all(g is None for g in grads):
            return
        targets = [pb.grad_target(x, can_accumulate=True) if need else None
                   for x, need in zip(ins, needs)]
        writes = [t[0] for t in targets if t]

        def build(a):
            gys = [a(g) if g else None for g in grads]
            dests = [(a(t[0]), t[1]) if t else None for t in targets]

            def run() -> None:
                c = slot["ctx"]
                try:
                    result = op.backward(c, *gys)
                except Exception as err:
                    raise ExecutionError(f"{node.describe()} backward failed: {err}") from err
                result = check_backward(result, c, node)
                for g, dest in zip(result, dests):
                    if dest is None or g is None:
                        continue
                    target, add = dest
                    if add:
                        np.add(target, g, out=target, casting="unsafe")
                    else:
                        np.copyto(target, g, casting="unsafe")
            return [py_step(run, f"{node.name} backward")]
        # what forward kept (in its context) must outlive this step
        pb.step(f"{node.op_type} backward", [*ins, *outs, *(g for g in grads if g)], writes,
                build, "backward")
    return Lowered(node, backward, "python")


# -- views ---------------------------------------------------------------------------------------
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
        if ctx.dtype(y) != F32:
            return
        pb.step("view backward", [g], [dest], lambda a: [pb.rt.copy(a(g), a(dest), n, add)],
                "backward")
    return Lowered(node, backward if ctx.needs(x) else None, "view")


# -- convolution ----------------------------------------------------------------------------------
@dataclass
class Eltwise:
    name: str
    alpha: float = 0.0
    beta: float = 0.0


def eltwise_of(ctx: Context, node: Node, op) -> Eltwise | None:
    """The oneDNN activation computing ``node`` (None when there is none)."""
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
    if t == "Softplus":
        return Eltwise("soft_relu", 1.0)
    if t == "HardSigmoid":
        return Eltwise("hardsigmoid", float(op.alpha), float(op.beta))
    if t == "HardSwish":
        return Eltwise("hardswish", 1 / 6, 0.5)
    if t == "Mish":
        return Eltwise("mish")
    if t == "Gelu":
        return Eltwise("gelu_tanh" if op.approximate == "tanh" else "gelu_erf")
    if t == "Clip":
        if hasattr(op, "min") and "min" in op.attributes:  # opset 6: attributes
            lo, hi = float(op.min), float(op.max)
        else:
            bounds = []
            for i, default in ((1, -np.inf), (2, np.inf)):
                name = node.inputs[i] if len(node.inputs) > i else ""
                if not name:
                    bounds.append(default)
                    continue
                value = ctx.constant(name)
                if value is None or value.size != 1:
                    return None
                bounds.append(float(value.reshape(())))
            lo, hi = bounds
        if lo > hi:
            return None
        return Eltwise("clip", lo, hi)
    return None


ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Exp", "Log", "Sqrt", "Abs", "Neg",
               "Softplus", "HardSigmoid", "HardSwish", "Mish", "Gelu", "Clip")


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
    return nxt, e


def activation_backward(pb: PlanBuilder, y: str, g: str, e: Eltwise) -> str:
    """The gradient before a fused activation, from its output's gradient (and output)."""
    v = pb.value(y)
    gz = pb.temp(y)
    dims = list(v.shape)
    pb.step(f"{e.name} backward", [y, g], [gz],
            lambda a: [pb.rt.eltwise_backward(dims, v.layout, e.name, e.alpha, e.beta, True,
                                              a(y), a(g), a(gz))], "backward")
    return gz


def conv(ctx: Context, node: Node, op) -> Lowered | None:
    pb, rt = ctx.pb, ctx.rt
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else ""
    if len(ctx.shape(x)) != 4 or not ctx.float32(x, w, b, node.outputs[0]):
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

    def make(post):
        kernel = None
        for layout in (*tried, *CONV_LAYOUTS):
            k = rt.Conv(list(ctx.shape(x)), list(ctx.shape(w)), bool(b), list(win.strides),
                        list(win.pads_begin), list(win.pads_end), list(win.dilations),
                        int(op.group), post, ctx.backprop and (need_dx or need_dw), need_dx,
                        need_dw, layout)
            if "ref:" not in k.info and k.src_layout and k.dst_layout:
                return k
            kernel = kernel or k
        return kernel

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
    if residual is not None:  # the residual's bytes become the output
        y = pb.view(last, residual, ctx.shape(last))
    else:
        y = pb.output(last, ctx.shape(last), F32, k.dst_layout)
    reads = [xin, w, b, residual or ""]
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
    pb.step("conv", [*reads, *post_args, wf], [y],
            lambda a: [k.forward(a(xin), a(w), a(b) if b else None, a(y),
                                 [a(p) for p in post_args], a(wf) if wf else None)])
    if not (need_dx or need_dw):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        if act is not None:
            g = activation_backward(pb, y, g, act[1])
        if need_dx:
            dest, _ = pb.grad_target(xin)
            wb = weights_in_layout(ctx, k, "backward_data", w, "backward")
            pb.step("conv backward data", [g, w, wb], [dest],
                    lambda a: [k.backward_data(a(g), a(w), a(dest), a(wb) if wb else None)],
                    "backward")
        if need_dw:
            tw = pb.grad_target(w) if ctx.needs(w) else None
            tb = pb.grad_target(b) if ctx.needs(b) else None
            dw = tw[0] if tw else pb.temp(w)
            db = (tb[0] if tb else pb.temp(b)) if b else ""
            size = k.weights_bytes("diff_weights")
            dwk = pb.output(pb.fresh(f"{w}@diff_layout"), (size // 4,)) if size else ""
            pb.step("conv backward weights", [xin, g], [dw, db, dwk],
                    lambda a: list(k.backward_weights(a(xin), a(g), a(dw),
                                                      a(db) if db else None,
                                                      a(dwk) if dwk else None)), "backward")
    return Lowered(node, backward, "onednn")


def weights_in_layout(ctx: Context, k, which: str, w: str, phase: str) -> str:
    """The buffer holding ``w`` in kernel ``k``'s ``which`` layout ("" when ``w`` already is
    that layout). Training: an arena value, filled by a reorder just before its use, so it
    lives only that long (the weights change every step). Inference: an array of the plan's,
    filled by the prepare program, which runs again only when the weights change."""
    size = k.weights_bytes(which)
    if not size:
        return ""
    pb = ctx.pb
    buf = pb.output(pb.fresh(f"{w}@{which}"), (size // 4,))
    if not ctx.backprop:
        pb.values[buf].storage = "owned"
        phase = "prepare"
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

    def root(name: str) -> str:
        while values[name].storage == "view":
            name = values[name].base
        return name

    base = root(r)
    if values[base].storage != "arena":
        return None, None
    sharing = [n for n in values if root(n) == base]  # r and every other view of its bytes
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


# -- matrix products ---------------------------------------------------------------------------
def matmul_step(pb: PlanBuilder, a_name: str, a_dims, trans_a: bool, b_name: str, b_dims,
                trans_b: bool, out: str, bias: str = "", post: Eltwise | None = None,
                accumulate: bool = False, phase: str = "forward") -> None:
    a_dims, b_dims = list(a_dims), list(b_dims)
    pb.step("matmul", [a_name, b_name, bias, *([out] if accumulate else [])], [out],
            lambda a: [pb.rt.matmul(a_dims, b_dims, trans_a, trans_b, a(a_name), a(b_name),
                                    a(bias) if bias else None, a(out),
                                    post.name if post else "", post.alpha if post else 0.0,
                                    post.beta if post else 0.0, accumulate)], phase)


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
                        phase="backward")
        else:  # da = op(b) . dy^T
            matmul_step(pb, b, b_dims, trans_b, g, g_dims, True, dest, accumulate=add,
                        phase="backward")
    if ctx.needs(b):
        dest, add = pb.grad_target(b, can_accumulate=True)
        if not trans_b:  # db = op(a)^T . dy
            matmul_step(pb, a, a_dims, not trans_a, g, g_dims, False, dest, accumulate=add,
                        phase="backward")
        else:  # db = dy^T . op(a)
            matmul_step(pb, g, g_dims, True, a, a_dims, trans_a, dest, accumulate=add,
                        phase="backward")


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
                act[1] if act else None)
    if not any(ctx.needs(v) for v in (a, b, c)):
        return Lowered(node, None, "onednn")

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
    return Lowered(node, backward, "onednn")


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
    a_in = pb.require_layout(a, "plain")
    y = pb.output(out, so)
    matmul_step(pb, a_in, a_dims, False, b, b_dims, False, y)
    if not (ctx.needs(a) or ctx.needs(b)):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is not None:
            product_backward(pb, ctx, g, a_in, a_dims, False, b, b_dims, False)
    return Lowered(node, backward, "onednn")


# -- pooling, normalization ------------------------------------------------------------------
def pool(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4 or not ctx.float32(x, out) or any(o for o in node.outputs[1:]):
        return None
    t = node.op_type
    if t in ("GlobalAveragePool", "GlobalMaxPool"):
        kernel, strides, pads, dil = list(shape[2:]), [1, 1], [0, 0], [1, 1]
        alg = "max" if t == "GlobalMaxPool" else "avg_exclude"
    else:
        win = op.window(np.broadcast_to(F32.type(0), shape))
        kernel, strides, pads, dil = (list(win.kernel), list(win.strides),
                                      list(win.pads_begin), list(win.dilations))
        if t == "MaxPool":
            alg = "max"
        else:
            include = bool(getattr(op, "count_include_pad", 0))
            if include and any(win.extra_end):
                return None
            alg = "avg_include" if include else "avg_exclude"
    layout = pb.value(x).layout
    train = ctx.needs(x)
    k = ctx.rt.Pool(list(shape), list(ctx.shape(out)), layout, alg, kernel, strides, pads, dil,
                    train)
    ctx.kernels.append(k)
    y = pb.output(out, ctx.shape(out), F32, layout)
    pb.step(t, [x], [y], lambda a: [k.forward(a(x), a(y))])
    if not train:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x)
        pb.step(f"{t} backward", [g], [dest], lambda a: [k.backward(a(g), a(dest))], "backward")
    return Lowered(node, backward, "onednn")


def batchnorm(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    if len(node.inputs) < 5:
        return None
    x, scale, bias, mean, var = node.inputs[:5]
    out = node.outputs[0]
    shape = ctx.shape(x)
    if len(shape) < 2 or not ctx.float32(x, scale, bias, mean, var, out):
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
    relu = ctx.single_consumer(out, ("Relu",))
    if relu is not None and not ctx.float32(relu.outputs[0]):
        relu = None
    k = ctx.rt.BatchNorm(list(shape), layout, float(op.epsilon), float(op.momentum), training,
                         relu is not None)
    ctx.kernels.append(k)
    last = out
    if relu is not None:
        ctx.absorb(node, relu)
        last = relu.outputs[0]
    y = pb.output(last, shape, F32, layout)
    pb.step("BatchNormalization", [x, scale, bias, mean, var], [y],
            lambda a: [k.forward(a(x), a(scale), a(bias), a(mean), a(var), a(y))])
    if training and mean in ctx.state and var in ctx.state:
        pb.step("running statistics", [mean, var], [mean, var],
                lambda a: [k.update(a(mean), a(var))])
    if not backward_needed:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dx, ds, db = norm_gradients(pb, ctx, x, x, scale, bias)
        pb.step("BatchNormalization backward", [x, g, scale], [dx, ds, db],
                lambda a: [k.backward(a(x), a(g), a(scale), a(dx), a(ds) if ds else None,
                                      a(db) if db else None)], "backward")
    return Lowered(node, backward, "onednn")


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


def norm_gradients(pb: PlanBuilder, ctx: Context, x: str, xin: str, scale: str, bias: str
                   ) -> tuple[str, str, str]:
    """Where a normalization's backward writes d(x), d(scale), d(bias): their gradients, or
    a temporary for d(x) (the kernel computes it anyway) and "" for the others, when no
    gradient is wanted. ``xin`` is the value the kernel read for ``x``."""
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
    k = ctx.rt.LayerNorm(rows, cols, float(op.epsilon), train, bool(bias))
    ctx.kernels.append(k)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, shape)
    pb.step("LayerNormalization", [xin, scale, bias], [y],
            lambda a: [k.forward(a(xin), a(scale), a(bias) if bias else None, a(y))])
    if not train:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dx, ds, db = norm_gradients(pb, ctx, x, xin, scale, bias)
        pb.step("LayerNormalization backward", [xin, g, scale, bias], [dx, ds, db],
                lambda a: [k.backward(a(xin), a(g), a(scale), a(bias) if bias else None, a(dx),
                                      a(ds) if ds else None,
                                      a(db) if db else None)], "backward")
    return Lowered(node, backward, "onednn")


# -- elementwise ---------------------------------------------------------------------------------
def eltwise(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    e = eltwise_of(ctx, node, op)
    if e is None or not ctx.float32(x, out):
        return None
    if ctx.needs(x) and e.name in ("abs", "round"):
        return None  # their derivative at 0 differs from the operator's
    v = pb.value(x)
    layout = v.layout
    dims = list(v.shape)
    y = pb.output(out, v.shape, F32, layout)
    pb.step(node.op_type, [x], [y],
            lambda a: [pb.rt.eltwise(dims, layout, e.name, e.alpha, e.beta, a(x), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")
    use_dst = pb.rt.eltwise_has_dst_form(e.name, e.alpha)

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(x)
        saved = y if use_dst else x
        pb.step(f"{node.op_type} backward", [saved, g], [dest],
                lambda a: [pb.rt.eltwise_backward(dims, layout, e.name, e.alpha, e.beta,
                                                  use_dst, a(saved), a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


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
    if rank == 0:
        return None
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
            if ctx.needs(a):
                dest, add = pb.grad_target(a_in, can_accumulate=True)
                pb.step("copy", [g], [dest], lambda x: [pb.rt.copy(x(g), x(dest), count, add)],
                        "backward")
            if ctx.needs(b):
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
    dims = list(ctx.shape(out))
    y = pb.output(out, dims, F32, layout)
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


# -- softmax, loss, concat, transpose ---------------------------------------------------------
def softmax(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not shape or not ctx.float32(x, out):
        return None
    axis = int(op.axis) % len(shape)
    log = node.op_type == "LogSoftmax"
    if type(op).since < 13:  # the input coerced to 2-D at axis
        dims, axis = [prod(shape[:axis]), prod(shape[axis:])], 1
    else:
        dims = list(shape)
    xin = pb.require_layout(x, "plain")
    y = pb.output(out, shape)
    pb.step(node.op_type, [xin], [y], lambda a: [pb.rt.softmax(dims, axis, log, a(xin), a(y))])
    if not ctx.needs(x):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        dest, _ = pb.grad_target(xin)
        pb.step(f"{node.op_type} backward", [y, g], [dest],
                lambda a: [pb.rt.softmax_backward(dims, axis, log, a(y), a(g), a(dest))],
                "backward")
    return Lowered(node, backward, "onednn")


def cross_entropy(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    scores, labels = node.inputs[:2]
    loss = node.outputs[0]
    logp_out = node.outputs[1] if len(node.outputs) > 1 else ""
    if (len(node.inputs) > 2 and node.inputs[2]) or op.ignore_index is not None \
            or op.reduction != "mean":
        return None
    shape = ctx.shape(scores)
    if len(shape) != 2 or not ctx.float32(scores) or ctx.dtype(labels) != np.int64 \
            or ctx.shape(labels) != shape[:1]:
        return None
    if logp_out and (ctx.consumers.get(logp_out) or logp_out in ctx.protected):
        return None
    n, c = shape
    s_in = pb.require_layout(scores, "plain")
    out = pb.output(loss, ())
    logp = pb.output(logp_out or pb.fresh("logp"), shape)
    pb.step("SoftmaxCrossEntropyLoss", [s_in, labels], [out, logp],
            lambda a: [pb.rt.cross_entropy(n, c, a(s_in), a(labels), a(out), a(logp))])
    if not ctx.needs(scores):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(out)
        if g is None:
            return
        dest, _ = pb.grad_target(s_in)
        pb.step("SoftmaxCrossEntropyLoss backward", [g, logp, labels], [dest],
                lambda a: [pb.rt.cross_entropy_backward(n, c, a(g), a(logp), a(labels),
                                                        a(dest))], "backward")
    return Lowered(node, backward, "native")


def concat(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    xs = list(node.inputs)
    out = node.outputs[0]
    if not xs or any(not x for x in xs) or not ctx.float32(*xs, out):
        return None
    rank = len(ctx.shape(out))
    axis = int(op.axis) % rank
    layout = pb.value(xs[0]).layout
    if rank != 4 or axis != 1 or layout not in ("nhwc", "plain") \
            and any(ctx.shape(x)[1] % 16 for x in xs):
        layout = "plain"
    ins = [pb.require_layout(x, layout) for x in xs]
    dims = [list(ctx.shape(x)) for x in xs]
    y = pb.output(out, ctx.shape(out), F32, layout)
    pb.step("Concat", ins, [y], lambda a: [pb.rt.concat(dims, layout, axis, [a(x) for x in ins],
                                                        a(y))])
    if not any(ctx.needs(x) for x in xs):
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        g = pb.grad(y)
        if g is None:
            return
        targets = [pb.grad_target(x)[0] if ctx.needs(x) else None for x in ins]
        pb.step("Concat backward", [g], [t for t in targets if t],
                lambda a: list(pb.rt.concat_backward(dims, layout, axis, a(g),
                                                     [a(t) if t else None for t in targets])),
                "backward")
    return Lowered(node, backward, "onednn")


def transpose(ctx: Context, node: Node, op) -> Lowered | None:
    pb = ctx.pb
    x, out = node.inputs[0], node.outputs[0]
    shape = ctx.shape(x)
    if not ctx.float32(x, out) or not shape:
        return None
    perm = list(op.perm) if op.perm is not None else list(range(len(shape)))[::-1]
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


def gather(ctx: Context, node: Node, op) -> Lowered | None:
    """Gather of one constant index along the first axis that has more than one element
    before it: a contiguous block of the input, so a view (the split of PyTorch's packed
    attention projections)."""
    pb = ctx.pb
    data, idx = node.inputs
    out = node.outputs[0]
    index = ctx.constant(idx)
    shape = ctx.shape(data)
    if index is None or index.size != 1 or not shape or not ctx.float32(data, out):
        return None
    axis = int(op.axis) % len(shape)
    if any(d != 1 for d in shape[:axis]):
        return None
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

        def build(a):
            steps = [] if add else [pb.rt.fill(a(dest), total, 0.0)]
            region = a(dest).reshape(-1)[i * block:(i + 1) * block]
            return [*steps, pb.rt.copy(a(g), region, block, True)]
        pb.step("Gather backward", [g, dest] if add else [g], [dest], build, "backward")
    return Lowered(node, backward, "view")


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


KERNELS: dict[str, Callable] = {
    "Gather": gather,
    "ReduceMean": reduce_mean,
    "ReduceSum": reduce_mean,
    "Conv": conv,
    "Gemm": gemm,
    "MatMul": matmul,
    "MaxPool": pool,
    "AveragePool": pool,
    "GlobalAveragePool": pool,
    "GlobalMaxPool": pool,
    "BatchNormalization": batchnorm,
    "LayerNormalization": layernorm,
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "SoftmaxCrossEntropyLoss": cross_entropy,
    "Concat": concat,
    "Transpose": transpose,
    "Sum": sum_node,
    **{t: binary for t in BINARY},
    **{t: eltwise for t in ACTIVATIONS},
    **{t: view_node for t in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                              "Dropout")},
}
