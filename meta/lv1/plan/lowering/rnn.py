"""Recurrent lowerings: ONNX LSTM and GRU (linear_before_reset 0 and 1; forward, reverse and
bidirectional) as oneDNN's RNN primitives, forward and backward. C++ side: cpp/plan/rnn.cpp,
which bridges the gate orders, weight layouts, biases and the bidirectional output layout.

What exporters write around a recurrent node costs nothing where the kernel can take it over:
the Slices, Concats and Unsqueezes that build W, R and B from the parameters (PyTorch's
reorder the gates) fold into the kernel, which reads the parameters' rows and writes their
gradients' (``fold_slice``, ``fold_weights``); the Transposes and views that turn Y back
into oneDNN's order are written by the kernel directly (``output_layout``).

A node the primitives cannot compute exactly as ONNX defines it (ragged or fed
``sequence_lens``, peepholes, ``clip``, other activations, ``input_forget``, ``layout=1``,
another dtype) runs the operator's own code in a Python step, and its placement says why:
``"python (LSTM: clip)"``.
"""

from __future__ import annotations

from math import prod

import numpy as np

from meta.lv0 import InferenceContext
from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lookup, Lowered, PlanBuilder
from meta.lv1.plan.context import Context

DEFAULTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
# What an exporter builds W, R and B from parameters with: PyTorch's reorders the gates with
# Slices and Concats, adds the direction axis with Unsqueeze and joins two directions.
CHAIN = frozenset({"Slice", "Concat", "Transpose", *VIEWS})
TAG = 40  # an element of a weight chain: (its source << TAG) | its index in the source


def unsupported(ctx: Context, node: Node, op) -> str | None:
    """Why the oneDNN primitives cannot run ``node`` exactly (None: they can)."""
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    x, w, r, b, lens, h0, c0, p = ins[:8]
    kind = node.op_type
    if not ctx.float32(x, w, r, b, h0, c0, *node.outputs):
        return "not float32"
    if op.direction not in DIRECTIONS:
        return f"direction {op.direction!r}"
    if int(op.layout):
        return "layout=1"
    if op.clip is not None:
        return "clip"
    if op.activations and [a.lower() for a in op.activations] != \
            DEFAULTS[kind] * DIRECTIONS[op.direction] or op.activation_alpha \
            or op.activation_beta:
        return "non-default activations"
    if kind == "LSTM" and (int(op.input_forget) or p):
        return "input_forget" if int(op.input_forget) else "peepholes"
    named = [v for v in (x, w, r, b, h0, c0) if v]
    if any(named.count(v) > 1 and ctx.needs(v) for v in named):  # (exporters pass one zero
        return "one tensor read as two inputs, with a gradient"  # state as h0 and c0: fine)
    shape = ctx.shape(x)
    if len(shape) != 3 or not all(shape):
        return f"input of shape {list(shape)}"
    if lens:
        value = ctx.constant(lens)
        if value is None:
            return "sequence_lens computed at run time"
        if np.any(np.asarray(value) != shape[0]):
            return "ragged sequence_lens"
    return None


def output_layout(ctx: Context, y: str, dirs: int) -> tuple[str, str, list[Node]]:
    """Where the kernel writes Y: (value, its layout, the nodes it absorbs). Exporters turn
    ONNX's Y [T, D, N, H] back into oneDNN's order: PyTorch writes a Transpose to [T, N, D, H]
    and a Reshape to [T, N, D*H] (or a Squeeze of one direction). The kernel writes the last
    of these itself in oneDNN's "tnc", and the nodes in between cost nothing; ("Y", "onnx",
    []) when no such Transpose follows. (The batch-first Transpose to [N, T, D*H] after them
    stays a node: written in "ntc", oneDNN 3.2's backward stops merging its gemms over time
    steps, which cost more than that copy.)"""
    steps, _, batch, hidden = ctx.shape(y)
    value, path, best = y, [], (y, "onnx", [])
    while True:
        node = ctx.single_consumer(value, ("Transpose", *VIEWS))
        if node is None or len(node.outputs) != 1 or not ctx.float32(node.outputs[0]):
            break
        if node.op_type == "Transpose":
            src = ctx.shape(value)
            perm = list(ctx.ops[node.name].perm or range(len(src))[::-1])
            if path or perm != [0, 2, 1, 3] or src != (steps, dirs, batch, hidden):
                break
        elif not path:  # a view of Y itself: its bytes are ONNX's order
            break
        path.append(node)  # a view keeps the element order
        value = node.outputs[0]
        best = (value, "tnc", list(path))
    return best


def producers(ctx: Context) -> dict[str, Node]:
    found = ctx.objects.get("rnn producers")
    if found is None:
        found = {o: n for readers in ctx.consumers.values() for n in readers for o in n.outputs
                 if o}
        ctx.objects["rnn producers"] = found
    return found


def tags(ctx: Context, name: str, sources: list[str], chain: list[Node]) -> np.ndarray | None:
    """Which source element each element of ``name`` is (``TAG``), when ``name`` is computed
    from values the plan holds (``sources``, grown) by data movement only (``chain``, grown):
    the chain's own operators run on the tags. None: anything else computes it."""
    node = producers(ctx).get(name)
    if not ctx.float32(name):
        return None
    if node is None:  # held before the plan runs (a parameter, a constant, a feed)
        if name not in sources:
            sources.append(name)
        i, shape = sources.index(name), ctx.shape(name)
        return ((i << TAG) + np.arange(prod(shape), dtype=np.int64)).reshape(shape)
    if node.op_type not in CHAIN or len(node.outputs) != 1:
        return None
    args = []
    for i, x in enumerate(node.inputs):
        if not x:
            args.append(None)
            continue
        data = i == 0 or node.op_type == "Concat"
        arg = tags(ctx, x, sources, chain) if data else ctx.constant(x)
        if arg is None:
            return None
        args.append(arg)
    if node not in chain:
        chain.append(node)
    return np.asarray(ctx.ops[node.name].apply(InferenceContext(), *args)[0])


def fold_weights(ctx: Context, rnn: Node) -> dict | None:
    """How the kernel reads ``rnn``'s W, R and B that data movement makes from held values:
    per weight its rows (source, first element) in the sources, the nodes that fold and the
    sources not wholly read (their gradients get zeros elsewhere). None when any such weight
    cannot fold: a row not contiguous in one source, an element read twice (its gradient
    would add up), a value of the chain read by another node or fetched."""
    x, w, r, b = (list(rnn.inputs) + [""] * 4)[:4]
    inputs, hidden = ctx.shape(x)[-1], ctx.shape(r)[-1]
    sources: list[str] = []
    chain: list[Node] = []
    rows, seen = {}, []
    for name, length in ((w, inputs), (r, hidden), (b, hidden)):
        if not name or name not in producers(ctx):
            continue
        t = tags(ctx, name, sources, chain)
        if t is None or t.shape != ctx.shape(name):
            return None
        flat = t.reshape(-1, length)
        if np.any(np.diff(flat, axis=1) != 1):
            return None
        rows[name] = np.stack([flat[:, 0] >> TAG, flat[:, 0] & ((1 << TAG) - 1)], axis=1)
        seen.append(t.ravel())
    if not chain:
        return None
    members = {n.name for n in chain} | {rnn.name}
    for n in chain:
        for o in n.outputs:
            if o in ctx.protected or any(c.name not in members for c in ctx.consumers.get(o, [])):
                return None
    every = np.concatenate(seen)
    if len(np.unique(every)) != len(every):
        return None
    counts = np.bincount(every >> TAG, minlength=len(sources))
    partial = [s for i, s in enumerate(sources) if counts[i] < prod(ctx.shape(s))]
    return {"sources": sources, "rows": rows, "chain": chain, "partial": partial}


def fold_slice(ctx: Context, node: Node, op) -> Lowered | None:
    """Slice: when it begins the nodes that make an LSTM's or GRU's W, R or B from its
    parameters (PyTorch's exporter reorders the gates with 24 Slices and 11 Concats for a
    bidirectional layer), they all fold into the recurrent kernel, which reads the
    parameters' rows and writes their gradients' (``fold_weights``); None otherwise (the
    operator's own code). Decided at the first Slice, before any of those nodes runs."""
    todo, seen, found = [node], {node.name}, {}
    while todo:  # what the slice feeds, through data movement: one recurrent node's weights
        n = todo.pop()
        for o in n.outputs:
            for c in ctx.consumers.get(o, []):
                if c.op_type in ("LSTM", "GRU") and o in c.inputs[1:4] and o != c.inputs[0]:
                    found[c.name] = c
                elif c.op_type in CHAIN and c.name not in seen:
                    seen.add(c.name)
                    todo.append(c)
                elif c.op_type not in CHAIN:
                    return None
    if len(found) != 1:
        return None
    rnn = next(iter(found.values()))
    key = ("rnn weights", rnn.name)
    if key not in ctx.objects:
        folded = fold_weights(ctx, rnn)
        if folded is not None and (
                unsupported(ctx, rnn, ctx.ops[rnn.name]) is not None
                or any(ctx.order[n.name] < ctx.order[node.name] for n in folded["chain"])):
            folded = None
        ctx.objects[key] = folded
        for n in folded["chain"] if folded else []:
            ctx.absorb(rnn, n)
    folded = ctx.objects[key]
    if folded is None or node not in folded["chain"]:
        return None
    return Lowered(node, None, "fused")


def whole(array: np.ndarray | None, length: int) -> tuple[list[np.ndarray], np.ndarray] | None:
    """``array``'s rows of ``length`` floats as the kernel reads and writes weights: (arrays,
    per row its array and first element)."""
    if array is None:
        return None
    rows = array.size // length
    return [array], np.stack([np.zeros(rows, np.int64), np.arange(rows) * length], axis=1)


def recurrent(ctx: Context, node: Node, op) -> Lowered | str:
    """``node`` as the RNN kernel's steps: its weights converted (prepare program, or the
    forward where the graph computes them), forward, and in training a backward writing every
    wanted gradient; otherwise why not (``kernels.lower`` then runs the operator's own code,
    its placement saying why)."""
    why = unsupported(ctx, node, op)
    if why is not None:
        return why
    pb = ctx.pb
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    x, w, r, b, _, h0, c0 = ins[:7]
    if node.op_type == "GRU":
        c0 = ""
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    y, yh, yc = outs[:3]
    steps, batch, inputs = ctx.shape(x)
    hidden = ctx.shape(r)[2]
    cell = "lstm" if node.op_type == "LSTM" else \
        "lbr_gru" if int(op.linear_before_reset) else "gru"
    needs = {v: ctx.needs(v) for v in (x, w, r, b, h0, c0) if v}
    # W, R and B an exporter builds from parameters (Slices, Concats): the kernel reads and
    # writes the parameters' rows (``fold_slice`` absorbed those nodes); else the values.
    folded = ctx.objects.get(("rnn weights", node.name)) or {"sources": [], "rows": {}}
    sources, rows = folded["sources"], folded["rows"]
    params = [v for v in (w, r, b) if v and v not in rows] + sources
    train = ctx.backprop and any(need for v, need in needs.items() if v not in rows) \
        or any(ctx.needs(v) for v in sources)
    layout = "onnx"
    if y:
        y, layout, after = output_layout(ctx, y, DIRECTIONS[op.direction])
        for n in after:
            ctx.absorb(node, n)
    k = ctx.rt.RNN(cell, steps, batch, inputs, hidden, op.direction, train, layout)
    ctx.kernels.append(k)

    def weights(arrays: list[np.ndarray], name: str, length: int, a: Lookup):
        """``name``'s rows in ``arrays`` (the sources' values or gradients), or its own."""
        if name in rows:
            return arrays, rows[name]
        return whole(a(name), length) if name else None
    # Weights the plan holds before it runs (parameters, constants): converted by the prepare
    # program; computed ones (a graph that computes its weights) just before the forward.
    fixed = all(pb.value(v).storage in ("external", "owned") for v in params)
    pb.step(f"{node.op_type} weights", params, [],
            lambda a: list(k.prepare(weights([a(s) for s in sources], w, inputs, a),
                                     weights([a(s) for s in sources], r, hidden, a),
                                     weights([a(s) for s in sources], b, hidden, a))),
            "prepare" if fixed else "forward")
    for o in (y, yh, yc):
        if o:
            pb.output(o, ctx.shape(o))

    def opt(a: Lookup, name: str) -> np.ndarray | None:
        return a(name) if name else None

    pb.step(node.op_type, [x, h0, c0], [y, yh, yc],
            lambda a: list(k.forward(a(x), opt(a, h0), opt(a, c0), opt(a, y), opt(a, yh),
                                     opt(a, yc))))
    if not train:
        return Lowered(node, None, "onednn")

    def backward(pb: PlanBuilder) -> None:
        grads = [pb.grad(o) if o else None for o in (y, yh, yc)]
        if all(g is None for g in grads):
            return
        gy, gyh, gyc = (g or "" for g in grads)
        targets = {v: pb.grad_target(v)[0] for v, need in needs.items()
                   if need and v not in rows}
        dx, dw, dr, db, dh0, dc0 = (targets.get(v, "") if v else ""
                                    for v in (x, w, r, b, h0, c0))
        # the sources' gradients (a source without one: rows written to a scratch value)
        dsources = [pb.grad_target(s)[0] if ctx.needs(s) else
                    pb.output(pb.fresh(f"{s}@unused grad"), ctx.shape(s)) for s in sources]
        zero = [g for s, g in zip(sources, dsources) if s in folded["partial"]]
        wanted = {v: bool(v) and (v in rows or v in targets) for v in (w, r, b)}

        def grad_rows(a: Lookup, name: str, length: int, target: str):
            if not wanted[name]:
                return None
            return weights([a(g) for g in dsources], name, length, lambda _: a(target))
        pb.step(f"{node.op_type} backward", [x, h0, c0, y, yh, yc, gy, gyh, gyc],
                [dx, dw, dr, db, dh0, dc0, *dsources],
                lambda a: list(k.backward(a(x), opt(a, h0), opt(a, c0), opt(a, y), opt(a, yh),
                                          opt(a, yc), opt(a, gy), opt(a, gyh), opt(a, gyc),
                                          opt(a, dx), grad_rows(a, w, inputs, dw),
                                          grad_rows(a, r, hidden, dr),
                                          grad_rows(a, b, hidden, db),
                                          opt(a, dh0), opt(a, dc0), [a(g) for g in zero])),
                "backward")
    return Lowered(node, backward, "onednn")
