"""Recurrent lowerings: ONNX LSTM and GRU (linear_before_reset 0 and 1; forward, reverse and
bidirectional) as oneDNN's RNN primitives, forward and backward. C++ side: cpp/plan/rnn.cpp,
which bridges the gate orders, weight layouts, biases and the bidirectional output layout.

A node the primitives cannot compute exactly as ONNX defines it (ragged or fed
``sequence_lens``, peepholes, ``clip``, other activations, ``input_forget``, ``layout=1``,
another dtype) runs the operator's own code in a Python step, and its placement says why:
``"python (LSTM: clip)"``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from meta.lv1.graph import Node
from meta.lv1.plan.builder import Lowered, PlanBuilder
from meta.lv1.plan.context import Context

DEFAULTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


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
    ONNX's Y [T, D, N, H] back into oneDNN's order: PyTorch writes a Transpose to [T, N, D, H],
    a Reshape to [T, N, D*H] (or a Squeeze of one direction) and, batch first, a Transpose to
    [N, T, D*H]. The kernel writes the last of these that is oneDNN's "tnc" or "ntc" itself,
    and the nodes in between cost nothing; ("Y", "onnx", []) when no Transpose follows."""
    steps, _, batch, hidden = ctx.shape(y)
    order = "tdnh" if dirs > 1 else "tndh"  # the element order of the value reached
    value, path, best = y, [], (y, "onnx", [])
    while True:
        node = ctx.single_consumer(value, ("Transpose", *VIEWS))
        if node is None or len(node.outputs) != 1 or not ctx.float32(node.outputs[0]):
            break
        src = ctx.shape(value)
        if node.op_type == "Transpose":
            perm = list(ctx.ops[node.name].perm or range(len(src))[::-1])
            if order == "tdnh" and src == (steps, dirs, batch, hidden) and perm == [0, 2, 1, 3]:
                order = "tndh"
            elif order == "tndh" and (src == (steps, batch, dirs * hidden) and perm == [1, 0, 2]
                                      or src == (steps, batch, dirs, hidden)
                                      and perm == [1, 0, 2, 3]):
                order = "ntdh"
            else:
                break
        path.append(node)  # (a view keeps the element order)
        value = node.outputs[0]
        if order != "tdnh" and any(n.op_type == "Transpose" for n in path):
            best = (value, "tnc" if order == "tndh" else "ntc", list(path))
    return best


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
    params = [v for v in (w, r, b) if v]
    needs = {v: ctx.needs(v) for v in (x, w, r, b, h0, c0) if v}
    train = ctx.backprop and any(needs.values())
    layout = "onnx"
    if y:
        y, layout, after = output_layout(ctx, y, DIRECTIONS[op.direction])
        for n in after:
            ctx.absorb(node, n)
    k = ctx.rt.RNN(cell, steps, batch, inputs, hidden, op.direction, train, layout)
    ctx.kernels.append(k)
    # Weights the plan holds before it runs (parameters, constants): converted by the prepare
    # program; computed ones (a graph that slices its weights) just before the forward.
    fixed = all(pb.value(v).storage in ("external", "owned") for v in params)
    pb.step(f"{node.op_type} weights", params, [],
            lambda a: list(k.prepare(whole(a(w), inputs), whole(a(r), hidden),
                                     whole(a(b), hidden) if b else None)),
            "prepare" if fixed else "forward")
    for o in (y, yh, yc):
        if o:
            pb.output(o, ctx.shape(o))

    def opt(a: Callable[[str], np.ndarray], name: str) -> np.ndarray | None:
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
        targets = {v: pb.grad_target(v)[0] for v, need in needs.items() if need}
        dx, dw, dr, db, dh0, dc0 = (targets.get(v, "") if v else ""
                                    for v in (x, w, r, b, h0, c0))
        pb.step(f"{node.op_type} backward", [x, h0, c0, y, yh, yc, gy, gyh, gyc],
                [dx, dw, dr, db, dh0, dc0],
                lambda a: list(k.backward(a(x), opt(a, h0), opt(a, c0), opt(a, y), opt(a, yh),
                                          opt(a, yc), opt(a, gy), opt(a, gyh), opt(a, gyc),
                                          opt(a, dx), whole(opt(a, dw), inputs),
                                          whole(opt(a, dr), hidden), whole(opt(a, db), hidden),
                                          opt(a, dh0), opt(a, dc0), [])), "backward")
    return Lowered(node, backward, "onednn")
