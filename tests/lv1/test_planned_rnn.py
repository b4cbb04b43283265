"""LSTM and GRU as planned kernels (oneDNN's RNN primitives, cpp/plan/rnn.cpp): outputs and
every gradient (X, W, R, B, initial_h, initial_c) against the operators' numpy reference, over
directions, both GRU reset forms, batch 1, one step, with and without initial states and
bias; and what stays a Python step says why in ``placement()``."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

GATES = {"LSTM": 4, "GRU": 3}


def rnn_graph(op: str, steps: int, batch: int, inputs: int, hidden: int, direction: str,
              *, states: bool = True, bias: bool = True, use: str = "all",
              seed: int = 0, lens: np.ndarray | None = None, **attrs):
    """One ``op`` node whose outputs a weighted sum turns into the loss; W, R and B are the
    graph's parameters, X and the initial states fed (their gradients asked with ``wrt``)."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    b = GraphBuilder(op.lower(), opset=14)
    x = b.input("x", np.float32, (steps, batch, inputs))
    w = b.initializer("W", rng.uniform(-0.5, 0.5, (dirs, g * hidden, inputs)).astype(np.float32))
    r = b.initializer("R", rng.uniform(-0.5, 0.5, (dirs, g * hidden, hidden)).astype(np.float32))
    ins = [x, w, r]
    ins.append(b.initializer("B", rng.uniform(-0.5, 0.5, (dirs, 2 * g * hidden))
                             .astype(np.float32)) if bias else "")
    ins.append(b.initializer("lens", lens) if lens is not None else "")
    feeds = {"x": rng.standard_normal((steps, batch, inputs)).astype(np.float32)}
    names = ["h0", "c0"] if op == "LSTM" else ["h0"]
    for name in names:
        ins.append(b.input(name, np.float32, (dirs, batch, hidden)) if states else "")
        if states:
            feeds[name] = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    outs = ["y", "y_h", "y_c"][:len(names) + 1]
    b.node(op, ins, outputs=outs, name="rnn", direction=direction, hidden_size=hidden, **attrs)
    terms = []
    for out, shape in zip(outs, [(steps, dirs, batch, hidden)] + [(dirs, batch, hidden)] * 2):
        if use != "all" and out != use:
            continue
        feeds[f"k_{out}"] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        k = b.input(f"k_{out}", np.float32, shape)
        terms.append(b.node("ReduceSum", [b.node("Mul", [out, k])], keepdims=0))
    b.node("Sum", terms, name="loss")
    for out in outs:
        b.output(out, np.float32)
    b.output("loss", np.float32, ())
    wrt = ["x", *(names if states else [])]
    return b.build(), feeds, wrt, outs


def check(op: str, *shape, tol: float = 2e-5, **kw) -> PlannedExecutor:
    graph, feeds, wrt, outs = rnn_graph(op, *shape, **kw)
    ref_graph = rnn_graph(op, *shape, **kw)[0]
    want, dwant = ReferenceExecutor(ref_graph).inference_and_backprop(feeds, outputs=outs,
                                                                      wrt=wrt)
    planned = PlannedExecutor(graph)
    for _ in range(2):  # the second call runs the same plan again
        got, dgot = planned.inference_and_backprop(feeds, outputs=outs, wrt=wrt)
        assert planned.placement()["rnn"] == "onednn", planned.placement()
        for name in [*outs, "loss"]:
            np.testing.assert_allclose(got[name], want[name], rtol=tol, atol=tol,
                                       err_msg=f"{op} {name}")
        assert set(dgot) == set(dwant), (sorted(dgot), sorted(dwant))
        for name in dwant:
            np.testing.assert_allclose(dgot[name], dwant[name], rtol=tol, atol=tol,
                                       err_msg=f"{op} d loss / d {name}")
    # inference: a plan of its own (forward_inference, the kernels' packed weights)
    inferred = PlannedExecutor(graph).inference(feeds, outputs=outs)
    for name in outs:
        np.testing.assert_allclose(inferred[name], want[name], rtol=tol, atol=tol,
                                   err_msg=f"{op} inference {name}")
    return planned


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_outputs_and_gradients(direction):
    check("LSTM", 5, 3, 4, 6, direction)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_outputs_and_gradients(direction, lbr):
    check("GRU", 5, 3, 4, 6, direction, linear_before_reset=lbr)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("shape", [(1, 2, 3, 5), (4, 1, 3, 5), (1, 1, 2, 3), (7, 4, 16, 8)],
                         ids=["one-step", "batch-1", "one-of-each", "larger"])
def test_edge_shapes(op, shape):
    check(op, *shape, "bidirectional")
    check(op, *shape, "forward", linear_before_reset=1) if op == "GRU" else \
        check(op, *shape, "forward")


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_without_initial_states_or_bias(op):
    check(op, 4, 2, 3, 5, "bidirectional", states=False)
    check(op, 4, 2, 3, 5, "forward", bias=False)
    check(op, 4, 2, 3, 5, "reverse", states=False, bias=False)


@pytest.mark.parametrize("op,use", [("LSTM", "y_h"), ("LSTM", "y_c"), ("LSTM", "y"),
                                    ("GRU", "y_h"), ("GRU", "y")])
def test_one_output_read(op, use):
    """Gradients reaching only one output: the others' gradients are zeros in the kernel."""
    check(op, 4, 3, 5, 4, "bidirectional", use=use)
    check(op, 4, 3, 5, 4, "forward", use=use)


def test_sequence_lens_all_full_is_planned():
    lens = np.full(3, 5, np.int32)
    check("LSTM", 5, 3, 4, 6, "bidirectional", lens=lens)


@pytest.mark.parametrize("attrs,lens,why", [
    ({"clip": 2.0}, None, "LSTM: clip"),
    ({}, np.array([5, 2, 4], np.int32), "LSTM: ragged sequence_lens"),
    ({"activations": ["Sigmoid", "Relu", "Tanh"]}, None, "LSTM: non-default activations"),
    ({"input_forget": 1}, None, "LSTM: input_forget"),
])
def test_what_the_kernel_cannot_do_stays_python_and_says_why(attrs, lens, why, capsys):
    graph, feeds, wrt, outs = rnn_graph("LSTM", 5, 3, 4, 6, "forward", lens=lens, **attrs)
    ref_graph = rnn_graph("LSTM", 5, 3, 4, 6, "forward", lens=lens, **attrs)[0]
    planned = PlannedExecutor(graph)
    got, dgot = planned.inference_and_backprop(feeds, outputs=outs, wrt=wrt)
    assert planned.placement()["rnn"] == f"python ({why})"
    assert why in capsys.readouterr().err  # said on stderr, once per operator and reason
    want, dwant = ReferenceExecutor(ref_graph).inference_and_backprop(feeds, outputs=outs,
                                                                      wrt=wrt)
    for name in dwant:
        np.testing.assert_allclose(dgot[name], dwant[name], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_changed_weights_reach_the_kernel(op):
    """The kernel's copies of W, R and B (its gate order and layouts) are made again when the
    weights move: every training step, and in inference when the graph's version moves."""
    graph, feeds, wrt, outs = rnn_graph(op, 4, 2, 3, 5, "bidirectional")
    ref_graph = rnn_graph(op, 4, 2, 3, 5, "bidirectional")[0]
    planned = PlannedExecutor(graph)
    planned.inference_and_backprop(feeds, outputs=outs, wrt=wrt)
    inferred = PlannedExecutor(graph)
    inferred.inference(feeds, outputs=outs)
    for g in (graph, ref_graph):
        for name in ("W", "R", "B"):
            g.initializers[name] *= np.float32(-0.5)
        g.touch()
    want, dwant = ReferenceExecutor(ref_graph).inference_and_backprop(feeds, outputs=outs,
                                                                      wrt=wrt)
    got, dgot = planned.inference_and_backprop(feeds, outputs=outs, wrt=wrt)
    for name in dwant:
        np.testing.assert_allclose(dgot[name], dwant[name], rtol=2e-5, atol=2e-5)
    for name, value in inferred.inference(feeds, outputs=outs).items():
        np.testing.assert_allclose(value, want[name], rtol=2e-5, atol=2e-5)


def exported_output_graph(op: str, direction: str, batch_first: bool, seed: int = 0):
    """Y turned back into oneDNN's order as PyTorch's exporters write it: Transpose(0, 2, 1, 3)
    and Reshape to [T, N, D*H] (one direction: a Squeeze in the TorchScript export, both in
    the dynamo one: ``"forward-transpose"``), then, batch first, Transpose to [N, T, D*H]; a
    weighted sum of that is the loss."""
    form, direction = direction, direction.split("-")[0]
    steps, batch, inputs, hidden = 5, 3, 4, 6
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    b = GraphBuilder("exported", opset=14)
    x = b.input("x", np.float32, (steps, batch, inputs))
    w = b.initializer("W", rng.uniform(-0.5, 0.5, (dirs, g * hidden, inputs)).astype(np.float32))
    r = b.initializer("R", rng.uniform(-0.5, 0.5, (dirs, g * hidden, hidden)).astype(np.float32))
    bias = b.initializer("B", rng.uniform(-0.5, 0.5, (dirs, 2 * g * hidden)).astype(np.float32))
    b.node(op, [x, w, r, bias], outputs=["y"], name="rnn", direction=direction,
           hidden_size=hidden)
    if dirs == 2 or form == "forward-transpose":
        t = b.node("Transpose", ["y"], name="to_tndh", perm=[0, 2, 1, 3])
        flat = b.node("Reshape", [t, b.initializer("shape", np.array([0, 0, -1], np.int64))],
                      name="flat")
    else:
        flat = b.node("Squeeze", ["y", b.initializer("axes", np.array([1], np.int64))],
                      name="flat")
    out = b.node("Transpose", [flat], name="to_ntc", perm=[1, 0, 2]) if batch_first else flat
    shape = (batch, steps, dirs * hidden) if batch_first else (steps, batch, dirs * hidden)
    k = b.input("k", np.float32, shape)
    b.node("ReduceSum", [b.node("Mul", [out, k])], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    feeds = {"x": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
             "k": rng.uniform(0.5, 1.5, shape).astype(np.float32)}
    return b.build(), feeds, out


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "forward-transpose", "bidirectional"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_exported_output_transposes_are_written_by_the_kernel(op, direction, batch_first):
    """The Transpose (and views) back to [T, N, D*H] after Y cost nothing: the kernel writes
    that value in oneDNN's "tnc" and reads its gradient there; a batch-first Transpose after
    it stays a node; the results are the reference's, and with Y fetched the kernel writes Y
    as ONNX has it instead."""
    graph, feeds, out = exported_output_graph(op, direction, batch_first)
    want, dwant = ReferenceExecutor(exported_output_graph(op, direction, batch_first)[0]) \
        .inference_and_backprop(feeds, outputs=[out, "y", "loss"], wrt=["x"])
    planned = PlannedExecutor(graph)
    for outputs in (["loss"], ["y", "loss"]):
        got, dgot = planned.inference_and_backprop(feeds, outputs=outputs, wrt=["x"])
        place = planned.placement()
        fused = [n for n in ("to_tndh", "flat", "to_ntc") if n in place
                 and place[n] == "fused into rnn"]
        expected = [n for n in ("to_tndh", "flat") if n in place] \
            if outputs == ["loss"] and direction != "forward" else []
        assert fused == expected, place
        for name in outputs:
            np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5)
        for name in dwant:
            np.testing.assert_allclose(dgot[name], dwant[name], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(planned.inference(feeds, outputs=[out])[out], want[out],
                               rtol=2e-5, atol=2e-5)


# PyTorch's gate blocks (LSTM i, f, g, o; GRU r, z, n) in ONNX's order (i, o, f, c; z, r, h)
TORCH_ORDER = {"LSTM": [(0, 1), (3, 4), (1, 3)], "GRU": [(1, 2), (0, 1), (2, 3)]}


def exported_weights_graph(op: str, direction: str, *, extra: int = 0, slice_read: bool = False,
                           param_read: bool = False, fed_bias: bool = False, seed: int = 0):
    """W, R and B as PyTorch's exporter makes them from ``nn.LSTM``'s or ``nn.GRU``'s
    parameters: each reordered by Slices of gate blocks and a Concat, given the direction axis
    by Unsqueeze, the two directions concatenated. ``extra``: rows of ``weight_ih`` no Slice
    reads; ``slice_read``: a Slice's output also read by the loss; ``param_read``: a parameter
    also read by the loss; ``fed_bias``: ``bias_ih`` an input (no gradient)."""
    steps, batch, inputs, hidden = 5, 3, 4, 6
    rng = np.random.default_rng(seed)
    dirs, gates = (2 if direction == "bidirectional" else 1), GATES[op]
    b = GraphBuilder("exported", opset=14)
    x = b.input("x", np.float32, (steps, batch, inputs))
    count = iter(range(1000))
    fed: dict[str, np.ndarray] = {}

    def const(values) -> str:
        return b.initializer(f"c{next(count)}", np.array(values, np.int64))

    def param(name: str, *shape: int) -> str:
        value = rng.uniform(-0.5, 0.5, shape).astype(np.float32)
        if fed_bias and name.startswith("bias_ih"):
            fed[name] = value
            return b.input(name, np.float32, shape)
        return b.initializer(name, value)

    def reorder(p: str) -> str:
        return b.node("Concat", [b.node("Slice", [p, const([lo * hidden]), const([hi * hidden]),
                                                  const([0])])
                                 for lo, hi in TORCH_ORDER[op]], axis=0)
    ws, rs, bs = [], [], []
    for d in range(dirs):
        sfx = "_reverse" if d else ""
        wih = param(f"weight_ih{sfx}", (gates + extra) * hidden, inputs)
        whh = param(f"weight_hh{sfx}", gates * hidden, hidden)
        bih, bhh = param(f"bias_ih{sfx}", gates * hidden), param(f"bias_hh{sfx}", gates * hidden)
        ws.append(b.node("Unsqueeze", [reorder(wih), const([0])]))
        rs.append(b.node("Unsqueeze", [reorder(whh), const([0])]))
        bs.append(b.node("Unsqueeze", [b.node("Concat", [reorder(bih), reorder(bhh)], axis=0),
                                       const([0])]))
    w, r, bias = (v[0] if dirs == 1 else b.node("Concat", v, axis=0) for v in (ws, rs, bs))
    b.node(op, [x, w, r, bias], outputs=["y"], name="rnn", direction=direction,
           hidden_size=hidden)
    k = b.input("k", np.float32, (steps, dirs, batch, hidden))
    terms = [b.node("ReduceSum", [b.node("Mul", ["y", k])], keepdims=0)]
    if slice_read:  # the first Slice (of weight_ih's i gate)
        first = next(n for n in b.nodes if n.op_type == "Slice").outputs[0]
        terms.append(b.node("ReduceSum", [b.node("Mul", [first, first])], keepdims=0))
    if param_read:
        terms.append(b.node("ReduceSum", [b.node("Mul", ["weight_ih", "weight_ih"])],
                            keepdims=0))
    b.node("Sum", terms, name="loss")
    b.output("loss", np.float32, ())
    feeds = {"x": rng.standard_normal((steps, batch, inputs)).astype(np.float32),
             "k": rng.uniform(0.5, 1.5, (steps, dirs, batch, hidden)).astype(np.float32),
             **fed}
    return b.build(), feeds


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("case", ["exported", "extra rows", "parameter read twice",
                                  "slice read elsewhere", "fed bias"])
def test_exported_weight_slices_fold_into_the_kernel(op, direction, case):
    """The Slices, Concats and Unsqueezes that build W, R and B from the parameters fold into
    the kernel, which reads the parameters' rows and writes their gradients (zeros in rows no
    Slice reads; added to the gradient another reader gives); a Slice whose output something
    else reads keeps them all as nodes; a source with no gradient (a fed bias) has its rows
    written to a scratch value. Loss and every gradient are the reference's."""
    kw = {"extra rows": {"extra": 1}, "parameter read twice": {"param_read": True},
          "slice read elsewhere": {"slice_read": True}, "fed bias": {"fed_bias": True}
          }.get(case, {})
    graph, feeds = exported_weights_graph(op, direction, **kw)
    want, dwant = ReferenceExecutor(exported_weights_graph(op, direction, **kw)[0]) \
        .inference_and_backprop(feeds, outputs=["y", "loss"], wrt=["x"])
    planned = PlannedExecutor(graph)
    for _ in range(2):
        got, dgot = planned.inference_and_backprop(feeds, outputs=["loss"], wrt=["x"])
        place = planned.placement()
        assert place["rnn"] == "onednn", place
        chain = {place[n.name] for n in graph.nodes
                 if n.op_type in ("Slice", "Concat", "Unsqueeze")}
        if case == "slice read elsewhere":
            assert "fused into rnn" not in chain, place
        else:
            assert chain == {"fused into rnn"}, place
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=2e-5)
        assert set(dgot) == set(dwant)
        for name in dwant:
            np.testing.assert_allclose(dgot[name], dwant[name], rtol=2e-5, atol=2e-5,
                                       err_msg=f"d loss / d {name}")
    got = PlannedExecutor(graph).inference(feeds, outputs=["y"])
    np.testing.assert_allclose(got["y"], want["y"], rtol=2e-5, atol=2e-5)


def test_changed_parameters_reach_the_folded_kernel():
    """With the exporter's Slices folded, the kernel reads the parameters themselves: moved
    parameters (a training step, or the graph's version in inference) reach it."""
    graph, feeds = exported_weights_graph("LSTM", "bidirectional")
    ref_graph = exported_weights_graph("LSTM", "bidirectional")[0]
    planned, inferred = PlannedExecutor(graph), PlannedExecutor(graph)
    planned.inference_and_backprop(feeds, outputs=["loss"], wrt=["x"])
    inferred.inference(feeds, outputs=["y"])
    for g in (graph, ref_graph):
        for name in g.parameters:
            g.initializers[name] *= np.float32(-0.5)
        g.touch()
    want, dwant = ReferenceExecutor(ref_graph).inference_and_backprop(
        feeds, outputs=["y", "loss"], wrt=["x"])
    got, dgot = planned.inference_and_backprop(feeds, outputs=["loss"], wrt=["x"])
    for name in dwant:
        np.testing.assert_allclose(dgot[name], dwant[name], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(inferred.inference(feeds, outputs=["y"])["y"], want["y"],
                               rtol=2e-5, atol=2e-5)
