"""Fused pointwise groups: a connected group of elementwise nodes of one output shape
(arithmetic, ``Pow`` by a constant or a tensor, ``Sqrt``, ``Reciprocal``, ``Exp``, ``Log``,
``Tanh``, ``Erf``, ``Sigmoid``, ``Softplus``, ``Neg``, ``Abs``, ``Min``/``Max``/``Clip``,
``Sum`` (any number of inputs: a lone one, or broadcast, which oneDNN's sum does not take),
``Where``, comparisons, ``IsNaN``/``IsInf``, ``Not``/``And``/``Or``, ``Cast`` between
float32 and bool; inputs broadcast to it) becomes one step of ``cpp/plan/fused.cpp``, a
register program evaluated over blocks of 1024 elements at a time on every thread. The
values between the group's nodes never exist as tensors, so a chain such as GPT-2's
tanh-GELU (eight nodes: eight passes over memory and eight tensors kept for the backward)
costs one pass; and ops with no oneDNN kernel (``Where``, ``Erf``, comparisons, a tensor
exponent) no longer leave the plan as Python steps.

The backward is derived from the expression (the chain rule per instruction, below in
``_adjoints``) as another program of the same instructions: it recomputes the forward's
values it needs from the group's inputs instead of keeping them (one more pass of cheap
arithmetic against a tensor kept per node), and writes each input's gradient; an input
broadcast into the group gets its gradient summed over the broadcast axes afterwards
(``eltwise.reduction``). Formulas follow the operators' own (``meta/ops``): Min/Max give the
gradient to the first input equal to the result, Clip none where the bound is taken, Abs
sign(x), Pow's exponent y log(a) with log 0 taken as 0.

A group is formed when its first node (in plan order) is lowered, from the eligible nodes not
yet lowered whose inputs exist by then (so kernels that absorb the nodes after them, such as
a MatMul's bias or the attention chain, have already taken theirs); a node whose input is
made later in the plan stays out (it starts a group of its own when lowered). A lone node
joins only when no kernel of its own would run it (``ALONE``). ``ENABLED = False`` lowers
node by node (to measure what fusing saves).
"""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import F32, Context
from meta.lv1.plan.lowering.eltwise import clip_bounds

ENABLED = True
BOOL = np.dtype(np.bool_)

# cpp/plan/fused.cpp's opcodes, in its order
OPCODES = ("load", "const", "add", "sub", "mul", "div", "pow", "powc", "min", "max", "sqrt",
           "recip", "exp", "log", "tanh", "erf", "sigmoid", "softplus", "neg", "abs", "where",
           "eq", "lt", "le", "gt", "ge", "not", "and", "or", "ne0", "sign", "erf_deriv",
           "log_safe", "addc", "mulc", "rsubc", "divc", "rdivc")
CODE = {name: i for i, name in enumerate(OPCODES)}

BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
UNARY = {"Sqrt": "sqrt", "Reciprocal": "recip", "Exp": "exp", "Log": "log", "Tanh": "tanh",
         "Erf": "erf", "Sigmoid": "sigmoid", "Softplus": "softplus", "Neg": "neg",
         "Abs": "abs"}
COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt",
           "GreaterOrEqual": "ge"}
LOGIC = {"Not": "not", "And": "and", "Or": "or"}
# Nodes fused even alone: none of the plan's kernels runs them (or not every case of them)
ALONE = {"Where", "Erf", "Softplus", "Min", "Max", "Cast", "IsNaN", "IsInf", *COMPARE, *LOGIC}


# -- the register program ----------------------------------------------------------------
class Program:
    """Instructions in SSA form (one value each), shared subexpressions merged."""

    def __init__(self) -> None:
        self.code: list[tuple[str, tuple[int, ...], float]] = []
        self._seen: dict = {}

    def emit(self, op: str, *args: int, imm: float = 0.0) -> int:
        key = (op, args, float(imm))
        if key not in self._seen:
            self.code.append(key)
            self._seen[key] = len(self.code) - 1
        return self._seen[key]

    def const(self, value: float) -> int:
        return self.emit("const", imm=float(np.float32(value)))

    def _immediates(self) -> None:
        """Binary instructions with a constant operand as their immediate forms (no register
        filled with the constant each block): a - c as a + (-c), exact in IEEE arithmetic."""
        consts = {i: imm for i, (op, _, imm) in enumerate(self.code) if op == "const"}
        for i, (op, args, _) in enumerate(self.code):
            if op not in ("add", "mul", "sub", "div") or not any(a in consts for a in args):
                continue
            a, b = args
            if op in ("add", "mul") and a in consts and b not in consts:
                a, b = b, a
            if b in consts and a not in consts:
                c = consts[b]
                form = {"add": ("addc", c), "mul": ("mulc", c), "sub": ("addc", -c),
                        "div": ("divc", c)}[op]
            elif a in consts and b not in consts:
                form = {"sub": ("rsubc", consts[a]), "div": ("rdivc", consts[a])}[op]
                a = b
            else:
                continue
            self.code[i] = (form[0], (a,), form[1])

    def compile(self, stores: list[int]) -> tuple[list[tuple], int, list[int]]:
        """(instructions for fused.cpp, registers, the register of each store): only what
        the stores need, each register reused once its value is read for the last time."""
        self._immediates()
        live = set(stores)
        for i in range(len(self.code) - 1, -1, -1):
            if i in live:
                op, args, _ = self.code[i]
                if op != "load":
                    live.update(args)
        order = [i for i in range(len(self.code)) if i in live]
        last: dict[int, int] = {}
        for k, i in enumerate(order):
            op, args, _ = self.code[i]
            if op != "load":
                for a in args:
                    last[a] = k
        for s in stores:
            last[s] = len(order)
        free: list[int] = []
        reg: dict[int, int] = {}
        count = 0
        out = []
        for k, i in enumerate(order):
            op, args, imm = self.code[i]
            srcs = [] if op == "load" else [reg[a] for a in args]
            for a in ([] if op == "load" else set(args)):
                if last[a] == k:
                    free.append(reg[a])
            if free:
                reg[i] = free.pop()
            else:
                reg[i], count = count, count + 1
            ops = list(args) if op == "load" else srcs
            ops += [-1] * (3 - len(ops))
            out.append((CODE[op], reg[i], *ops, imm))
        return out, max(count, 1), [reg[s] for s in stores]


def _derivative(p: Program, op: str, x: int, y: int) -> int:
    """dy/dx of a unary instruction ``op`` (y = op(x)), as the operator computes it."""
    if op == "sqrt":
        return p.emit("div", p.const(0.5), y)
    if op == "recip":
        return p.emit("neg", p.emit("mul", y, y))
    if op == "exp":
        return y
    if op == "log":
        return p.emit("recip", x)
    if op == "tanh":
        return p.emit("sub", p.const(1), p.emit("mul", y, y))
    if op == "erf":
        return p.emit("erf_deriv", x)
    if op == "sigmoid":
        return p.emit("mul", y, p.emit("sub", p.const(1), y))
    if op == "softplus":
        return p.emit("sigmoid", x)
    if op == "abs":
        return p.emit("sign", x)
    raise AssertionError(f"no derivative for {op}")


def _adjoints(p: Program, seeds: dict[int, int]) -> dict[int, int]:
    """Reverse-mode derivative of ``p``'s instructions: value -> its adjoint, given the
    adjoints of some values (``seeds``); ``p`` grows by the instructions that compute them."""
    adj = dict(seeds)

    def add(v: int, g: int) -> None:
        adj[v] = p.emit("add", adj[v], g) if v in adj else g

    zero = None
    for i in range(len(p.code) - 1, -1, -1):
        if i not in adj:
            continue
        op, args, imm = p.code[i]
        g = adj[i]
        if op in ("load", "const") or op in ("eq", "lt", "le", "gt", "ge", "not", "and", "or",
                                             "ne0", "sign"):
            continue
        a = args[0]
        b = args[1] if len(args) > 1 else None
        if op == "add":
            add(a, g)
            add(b, g)
        elif op == "sub":
            add(a, g)
            add(b, p.emit("neg", g))
        elif op == "mul":
            add(a, p.emit("mul", g, b))
            add(b, p.emit("mul", g, a))
        elif op == "div":  # da = g / b, db = -g y / b (ops/div.py)
            add(a, p.emit("div", g, b))
            add(b, p.emit("div", p.emit("mul", p.emit("neg", g), i), b))
        elif op == "powc":  # g c a^(c-1)
            deriv = p.emit("powc", a, imm=float(np.float32(imm) - np.float32(1)))
            add(a, p.emit("mul", p.emit("mul", g, p.const(imm)), deriv))
        elif op == "pow":  # da = g b a^(b-1), db = g y log a (ops/pow.py)
            add(a, p.emit("mul", p.emit("mul", g, b),
                          p.emit("pow", a, p.emit("sub", b, p.const(1)))))
            add(b, p.emit("mul", p.emit("mul", g, i), p.emit("log_safe", a)))
        elif op in ("min", "max"):  # the first operand equal to the result takes it
            zero = p.const(0) if zero is None else zero
            first = p.emit("eq", a, i)
            add(a, p.emit("where", first, g, zero))
            add(b, p.emit("where", first, zero, p.emit("where", p.emit("eq", b, i), g, zero)))
        elif op == "where":
            zero = p.const(0) if zero is None else zero
            add(b, p.emit("where", a, g, zero))
            add(args[2], p.emit("where", a, zero, g))
        elif op == "neg":
            add(a, p.emit("neg", g))
        else:
            add(a, p.emit("mul", g, _derivative(p, op, a, i)))
    return adj


# -- which nodes join -----------------------------------------------------------------------
def _scalar_constant(ctx: Context, name: str) -> float | None:
    v = ctx.constant(name) if name else None
    if v is None or v.size != 1 or v.dtype.kind not in "fiu":
        return None
    return float(np.asarray(v, np.float64).reshape(()))


def eligible(ctx: Context, node: Node) -> bool:
    """Whether ``node`` can be part of a fused group (its op and dtypes are covered)."""
    t = node.op_type
    ins = [x for x in node.inputs if x]
    if len(node.outputs) != 1 or not node.outputs[0] or not ins:
        return False
    out = node.outputs[0]
    dt = ctx.dtype(out)
    if prod(ctx.shape(out)) == 0:
        return False
    if t in BINARY or t in UNARY:
        return dt == F32 and ctx.float32(*ins) and len(ins) == (2 if t in BINARY else 1)
    if t in ("Min", "Max", "Sum"):
        return dt == F32 and ctx.float32(*ins)
    if t == "Pow":
        if len(ins) != 2 or dt != F32 or not ctx.float32(ins[0]):
            return False
        return ctx.float32(ins[1]) or _scalar_constant(ctx, ins[1]) is not None
    if t == "Clip":
        return dt == F32 and ctx.float32(node.inputs[0]) \
            and clip_bounds(ctx, node, ctx.ops[node.name]) is not None
    if t == "Where":
        return len(ins) == 3 and dt == F32 and ctx.dtype(node.inputs[0]) == BOOL \
            and ctx.float32(*node.inputs[1:])
    if t in COMPARE:
        return len(ins) == 2 and dt == BOOL and ctx.float32(*ins)
    if t in ("IsNaN", "IsInf"):
        return len(ins) == 1 and dt == BOOL and ctx.float32(*ins)
    if t in LOGIC:
        return dt == BOOL and all(ctx.dtype(x) == BOOL for x in ins)
    if t == "Cast":
        return dt in (F32, BOOL) and ctx.dtype(ins[0]) in (F32, BOOL)
    return False


def _producers(ctx: Context) -> dict[str, Node]:
    found = getattr(ctx, "_fused_producers", None)
    if found is None:
        found = {o: n for readers in ctx.consumers.values() for n in readers
                 for o in n.outputs if o}
        ctx._fused_producers = found
    return found


def group_of(ctx: Context, start: Node) -> list[Node]:
    """The nodes fused with ``start`` (the first of them in plan order), in plan order: the
    eligible nodes of its output shape connected to it, not yet lowered, each of whose
    inputs exists now or is computed in the group (and is no name a caller asked for)."""
    shape = ctx.shape(start.outputs[0])
    producers = _producers(ctx)
    here = ctx.order[start.name]
    members = {start.name: start}
    todo = [start]

    def joins(n: Node | None) -> bool:
        return n is not None and n.name not in members and n.name not in ctx.absorbed \
            and ctx.order.get(n.name, -1) > here and eligible(ctx, n) \
            and ctx.shape(n.outputs[0]) == shape

    while todo:
        n = todo.pop()
        near = [producers.get(x) for x in n.inputs if x and x not in ctx.protected]
        if n.outputs[0] not in ctx.protected:
            near += ctx.consumers.get(n.outputs[0], [])
        for m in near:
            if joins(m):
                members[m.name] = m
                todo.append(m)
    ordered = sorted(members.values(), key=lambda n: ctx.order[n.name])
    made: set[str] = set()
    kept = []
    for n in ordered:
        ok = all(not x or x in made or x in ctx.pb.values for x in n.inputs)
        if ok:
            kept.append(n)
            if n.outputs[0] not in ctx.protected:
                made.add(n.outputs[0])
    return kept


# -- lowering ------------------------------------------------------------------------------
def _strides(in_shape: tuple[int, ...], dims: tuple[int, ...]) -> list[int]:
    """Element strides of a plain array of ``in_shape`` read broadcast to ``dims``."""
    padded = (1,) * (len(dims) - len(in_shape)) + tuple(in_shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(step if d != 1 else 0)
        step *= d
    return list(reversed(strides))


def _coalesce(dims: tuple[int, ...], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Adjacent dims merged where every operand walks them as one (fewer, longer rows)."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    if not keep:
        return [1], [[0] for _ in strides]
    nd = [dims[keep[0]]]
    ns = [[s[keep[0]]] for s in strides]
    for i in keep[1:]:
        if all(s[-1] == o[i] * dims[i] for s, o in zip(ns, strides)):
            nd[-1] *= dims[i]
            for s, o in zip(ns, strides):
                s[-1] = o[i]
        else:
            nd.append(dims[i])
            for s, o in zip(ns, strides):
                s.append(o[i])
    return nd, ns


def _forward(ctx: Context, members: list[Node], inputs: list[str]
             ) -> tuple[Program, dict[str, int]]:
    """The program computing every member's output: tensor name -> its value."""
    p = Program()
    env: dict[str, int] = {}
    for k, x in enumerate(inputs):
        env[x] = p.emit("load", k)
    for n in members:  # scalar constants: in the program (no operand to read)
        for x in n.inputs:
            if x and x not in env and _scalar_constant(ctx, x) is not None:
                env[x] = p.const(_scalar_constant(ctx, x))
    for n in members:
        t, op = n.op_type, ctx.ops[n.name]
        args = [env[x] if x else -1 for x in n.inputs]
        if t in BINARY:
            v = p.emit(BINARY[t], args[0], args[1])
        elif t in UNARY:
            v = p.emit(UNARY[t], args[0])
        elif t in ("Min", "Max", "Sum"):
            v = args[0]
            for a in args[1:]:
                if a >= 0:
                    v = p.emit("add" if t == "Sum" else t.lower(), v, a)
        elif t == "Pow":
            c = _scalar_constant(ctx, n.inputs[1]) if not ctx.float32(n.inputs[1]) \
                or n.inputs[1] in ctx.static else None
            v = p.emit("powc", args[0], imm=float(np.float32(c))) if c is not None \
                else p.emit("pow", args[0], args[1])
        elif t == "Clip":
            lo, hi = clip_bounds(ctx, n, op)
            v = args[0]
            if lo != -np.inf:
                v = p.emit("max", v, p.const(lo))
            if hi != np.inf:
                v = p.emit("min", v, p.const(hi))
        elif t == "Where":
            v = p.emit("where", *args[:3])
        elif t in COMPARE:
            v = p.emit(COMPARE[t], args[0], args[1])
        elif t == "IsNaN":  # x != x
            v = p.emit("not", p.emit("eq", args[0], args[0]))
        elif t == "IsInf":
            sides = [p.emit("eq", args[0], p.const(inf)) for inf, on in
                     ((np.inf, op.detect_positive), (-np.inf, op.detect_negative)) if on]
            v = sides[0] if len(sides) == 1 else p.emit("or", *sides) if sides else \
                p.emit("ne0", p.const(0))
        elif t in LOGIC:
            v = p.emit(LOGIC[t], *args[:2])
        elif t == "Cast":
            v = p.emit("ne0", args[0]) if ctx.dtype(n.outputs[0]) == BOOL \
                and ctx.dtype(n.inputs[0]) != BOOL else args[0]
        else:
            raise AssertionError(t)
        env[n.outputs[0]] = v
    return p, env


def fused(ctx: Context, node: Node, op) -> Lowered | None:
    """``node`` and the group fused with it as one pointwise step (None: not fused)."""
    if not ENABLED or getattr(ctx.rt, "pointwise_opcodes", None) != len(OPCODES) \
            or not eligible(ctx, node):  # (a build of meta._plan older than this module)
        return None
    members = group_of(ctx, node)
    if len(members) == 1 and not _alone(ctx, node):
        return None
    pb = ctx.pb
    names = {n.name for n in members}
    made = {n.outputs[0] for n in members}
    scalars = {x for n in members for x in n.inputs if x and x not in made
               and _scalar_constant(ctx, x) is not None}
    inputs = list(dict.fromkeys(x for n in members for x in n.inputs
                                if x and x not in made and x not in scalars))
    outputs = [n.outputs[0] for n in members
               if n.outputs[0] in ctx.protected
               or any(c.name not in names for c in ctx.consumers.get(n.outputs[0], []))]
    dims = ctx.shape(node.outputs[0])
    ins = [pb.require_layout(x, "plain") for x in inputs]
    prog, env = _forward(ctx, members, inputs)
    full = [_strides(ctx.shape(x), dims) for x in inputs]
    cdims, cstrides = _coalesce(dims, full)
    code, registers, regs = prog.compile([env[o] for o in outputs])
    in_dtypes = [1 if ctx.dtype(x) == BOOL else 0 for x in inputs]
    out_dtypes = [1 if ctx.dtype(o) == BOOL else 0 for o in outputs]
    ys = [pb.output(o, dims, ctx.dtype(o)) for o in outputs]
    label = "fused " + "+".join(n.op_type for n in members)
    pb.step(label, ins, ys, lambda a: [pb.rt.pointwise(
        label, cdims, [(a(x), d, s) for x, d, s in zip(ins, in_dtypes, cstrides)],
        [(a(y), d, False, r) for y, d, r in zip(ys, out_dtypes, regs)], code, registers)])
    for n in members[1:]:
        ctx.absorb(node, n)
    if not any(ctx.needs(x) for x, d in zip(inputs, in_dtypes) if d == 0):
        return Lowered(node, None, "native")

    def backward(pb: PlanBuilder) -> None:
        grads = [(o, pb.grad(o)) for o, d in zip(outputs, out_dtypes) if d == 0]
        grads = [(o, g) for o, g in grads if g is not None]
        if not grads:
            return
        p, env = _forward(ctx, members, inputs)
        seeds: dict[int, int] = {}
        for k, (o, _) in enumerate(grads):
            s = p.emit("load", len(inputs) + k)
            seeds[env[o]] = p.emit("add", seeds[env[o]], s) if env[o] in seeds else s
        adj = _adjoints(p, seeds)
        wanted = [(k, x) for k, (x, d) in enumerate(zip(inputs, in_dtypes))
                  if d == 0 and ctx.needs(x) and env[x] in adj]
        if not wanted:
            return
        code, registers, regs = p.compile([adj[env[x]] for _, x in wanted])
        gnames = [g for _, g in grads]
        reads = [*ins, *gnames]
        dests, reduce = [], []
        for (k, x), r in zip(wanted, regs):
            xin = ins[k]
            if tuple(_strides(ctx.shape(x), dims)) == tuple(_strides(dims, dims)):
                dest, add = pb.grad_target(xin, can_accumulate=True)
                dests.append((dest, add, r))
            else:  # broadcast into the group: the full-shape gradient, then its sum
                t = pb.output(pb.fresh(f"{x}@fused_grad"), dims)
                dests.append((t, False, r))
                reduce.append((t, xin))
        g_strides = [_strides(dims, dims)] * len(gnames)
        cdims, cstrides = _coalesce(dims, [*full, *g_strides])
        b_dtypes = [*in_dtypes, *[0] * len(gnames)]
        writes = [d for d, _, _ in dests]
        blabel = f"{label} backward"
        pb.step(blabel, reads, writes, lambda a: [pb.rt.pointwise(
            blabel, cdims, [(a(x), d, s) for x, d, s in zip(reads, b_dtypes, cstrides)],
            [(a(d), 0, add, r) for d, add, r in dests], code, registers)], "backward")
        full_dims = list(dims)
        for t, xin in reduce:
            from meta.lv1.plan.lowering.eltwise import broadcast_dims

            to = broadcast_dims(ctx.shape(xin), len(dims))
            dest, _ = pb.grad_target(xin)
            pb.step(f"{label} backward (sum)", [t], [dest],
                    lambda a, t=t, dest=dest, to=to: [sum_to(
                        pb.rt, full_dims, to, a(t), a(dest))], "backward")
    return Lowered(node, backward, "native")


def sum_to(rt, dims: list[int], to: list[int], x: np.ndarray, y: np.ndarray):
    """The step summing plain ``x`` (dims) over the axes where ``to`` is 1: one run of such
    axes by ``reduce_mid`` (the rotary caches' gradient, summed over the heads: oneDNN's
    general reduction took 40 ms a step there, 8x128x8x32 at 1 thread), any other by
    ``eltwise.reduction``."""
    from meta.lv1.plan.lowering.eltwise import reduction

    summed = [i for i, (d, t) in enumerate(zip(dims, to)) if t == 1 and d != 1]
    if summed and all(to[i] == 1 for i in range(summed[0], summed[-1] + 1)):
        first, last = summed[0], summed[-1]
        return rt.reduce_mid(prod(dims[:first]), prod(dims[first:last + 1]),
                             prod(dims[last + 1:]), 1.0, x, y)
    return reduction(rt, dims, to, "plain", x, y)


def _alone(ctx: Context, node: Node) -> bool:
    """Whether a lone ``node`` is fused (no other kernel of the plan runs it)."""
    t = node.op_type
    if t in ALONE:
        return True
    if t == "Pow":
        return _scalar_constant(ctx, node.inputs[1]) is None or node.inputs[1] not in ctx.static
    if t == "Clip":
        return False
    if t == "Sum":  # sum_node takes two or more inputs of the output's shape
        ins = [x for x in node.inputs if x]
        return len(ins) == 1 or any(ctx.shape(x) != ctx.shape(node.outputs[0]) for x in ins)
    if t in BINARY:  # binary() takes a full-shape first operand (Add, Mul: either)
        out = ctx.shape(node.outputs[0])
        a, b = (ctx.shape(x) for x in node.inputs[:2])
        pad = len(out)
        full_a = (1,) * (pad - len(a)) + a == out
        full_b = (1,) * (pad - len(b)) + b == out
        if t == "Div" and ctx.constant(node.inputs[0]) is not None \
                and ctx.constant(node.inputs[0]).size == 1 and b == out:
            return False  # Div(c, x): broadcast.div's kernel
        return not (full_a or full_b and t in ("Add", "Mul"))
    return False
