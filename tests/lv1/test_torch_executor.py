"""The PyTorch executor: the same numbers as meta's reference executor (losses, gradients,
state, modes), user operators (Python and run-time-compiled C++) inside autograd, the graph's
arrays as the source of truth, and errors named up front. Skipped without PyTorch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'meta[torch]')")

from meta.common.component import ComponentError  # noqa: E402
from meta.lv0 import Context, Operator, entries, register, registry, unbroadcast  # noqa: E402
from meta.lv0.cpp_ops import build, register_cpp_op  # noqa: E402
from meta.lv1 import (  # noqa: E402
    EXECUTORS,
    Graph,
    GraphBuilder,
    GraphError,
    Node,
    ReferenceExecutor,
    TensorInfo,
    TorchExecutor,
    from_onnx,
    lenet5,
    mlp,
    resnet20,
    torch_ops,
)
from meta.lv2 import Optimizer, sgd  # noqa: E402
from meta.lv3.flat import FlatBuffer  # noqa: E402
from tests.lv0.cases import cases_for  # noqa: E402
from tests.lv0.test_ops import _serving_opset  # noqa: E402
from tests.lv1.test_control_flow import loop_model  # noqa: E402
from tests.lv1.test_state_model import _bn_net  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SWISH = REPO / "examples" / "cpp_ops" / "swish.cpp"
CUDA = torch.cuda.is_available()
TOL = 1e-5  # the acceptance bound: same first-step loss and gradients within 1e-5


def _batch(shape, n=8, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((n, *shape)).astype(dtype),
            "labels": rng.integers(0, 10, n).astype(np.int64)}


def _assert_close(ours, theirs, what, tol=TOL):
    err = np.abs(np.asarray(ours, np.float64) - np.asarray(theirs, np.float64))
    scale = max(1.0, float(np.abs(theirs).max(initial=0)))
    assert err.max(initial=0) <= tol * scale, f"{what}: max abs error {err.max():.3g}"


MODELS = [(mlp, (1, 28, 28), 16), (lenet5, (1, 28, 28), 8), (resnet20, (3, 32, 32), 8)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("build, shape, n", MODELS, ids=["mlp", "lenet5", "resnet20"])
def test_first_step_loss_gradients_and_state_match_the_reference(build, shape, n, dtype):
    """Float32 within 1e-5 (loss, logits, state; gradients for the MLP and LeNet-5), float64
    within 1e-10 (everything). A float32 ResNet-20's gradients are compared in float64 only:
    with ~1.5 M ReLU inputs per batch, a few land within float32 rounding of 0 (a residual
    sum such as -0.968194 + 0.968198), and a ReLU that opens in one executor and not in the
    other moves upstream gradients by ~1e-4: two roundings, not two maths."""
    tol = TOL if dtype == np.float32 else 1e-10
    ref_graph, torch_graph = build(seed=3, dtype=dtype), build(seed=3, dtype=dtype)
    batch = _batch(shape, n, dtype=dtype)
    ref = ReferenceExecutor(ref_graph).train()
    ours = TorchExecutor(torch_graph).train()
    assert set(ours.placement().values()) == {"pytorch"}  # every node on a torch function
    v_ref, g_ref = ref.inference_and_backprop(batch, outputs=["logits"])
    v_ours, g_ours = ours.inference_and_backprop(batch, outputs=["logits"])
    assert list(g_ours) == list(g_ref) == list(ref_graph.parameters)
    _assert_close(v_ours["loss"], v_ref["loss"], "loss", tol)
    _assert_close(v_ours["logits"], v_ref["logits"], "logits", tol)
    for name in g_ref:
        assert g_ours[name].dtype == g_ref[name].dtype and g_ours[name].shape == g_ref[name].shape
        if build is not resnet20 or dtype == np.float64:
            _assert_close(g_ours[name], g_ref[name], f"gradient of {name}", tol)
    for name in ref_graph.state:  # resnet20's running statistics, updated in training mode
        _assert_close(torch_graph.state[name], ref_graph.state[name], f"state {name}", tol)
        assert not np.array_equal(torch_graph.state[name], build(seed=3).state[name])
    ref.eval(), ours.eval()
    _assert_close(ours.inference(batch)["logits"], ref.inference(batch)["logits"],
                  "eval logits", tol)


def test_three_sgd_steps_follow_the_reference_with_batch_norm():
    graphs = [resnet20((3, 16, 16), width=4, seed=1, dtype=np.float64) for _ in range(2)]
    runs = []
    for graph, cls in zip(graphs, (ReferenceExecutor, TorchExecutor)):
        executor = cls(graph).train()
        optimizer = Optimizer(sgd(0.1, momentum=0.9), graph.parameters)
        losses = []
        for step in range(3):
            values, grads = executor.inference_and_backprop(
                _batch((3, 16, 16), 8, seed=step, dtype=np.float64))
            optimizer.step(grads)
            losses.append(float(values["loss"]))
        runs.append(losses)
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-10)
    for name in graphs[0].initializers:  # parameters and running statistics
        _assert_close(graphs[1].initializers[name], graphs[0].initializers[name], name, 1e-10)


def test_batch_norm_training_form_and_as_written_modes():
    """A training-form BatchNormalization (three outputs) with Clip, Div, Reshape and a host
    ReduceMean: the spec's running outputs, train/eval/as-written modes and state writes."""
    for training_form in (False, True):
        graphs = _bn_net(training_form=training_form), _bn_net(training_form=training_form)
        x = {"x": np.random.default_rng(0).standard_normal((4, 2, 4, 4))}
        ref, ours = ReferenceExecutor(graphs[0]), TorchExecutor(graphs[1])
        wanted = ["loss", "bn.mean_out", "bn.var_out"] if training_form else ["loss"]
        for mode in (None, True, False):
            if mode is not None:
                ref.train(mode), ours.train(mode)
            before = dict((k, v.copy()) for k, v in graphs[1].state.items())
            a, b = ref.inference(x, wanted), ours.inference(x, wanted)
            for name in wanted:
                _assert_close(b[name], a[name], f"{name} in mode {mode}")
            for name in graphs[0].state:
                _assert_close(graphs[1].state[name], graphs[0].state[name], name)
                assert np.array_equal(graphs[1].state[name], before[name]) == (mode is not True)
            _, g_ref = ref.inference_and_backprop(x, wrt=["x"])
            _, g_ours = ours.inference_and_backprop(x, wrt=["x"])
            for name in g_ref:
                _assert_close(g_ours[name], g_ref[name], f"gradient of {name} in mode {mode}")
        assert ours.placement()["loss"] == "host" and ours.placement()["bn"] == "pytorch"


def test_dropout_drops_in_training_only():
    b = GraphBuilder("drop")
    x = b.input("x", np.float32, ("N", 1000))
    y, mask = b.node("Dropout", [x, b.initializer("ratio", np.asarray(0.5, np.float32))],
                     n_outputs=2, name="drop")
    b.output(y, np.float32, ("N", 1000))
    b.output(mask, np.bool_, ("N", 1000))
    ex = TorchExecutor(b.build())
    ones = {"x": np.ones((2, 1000), np.float32)}
    out = ex.inference(ones)  # as written: inference
    assert np.array_equal(out[y], ones["x"]) and out[mask].all()
    out = ex.train().inference(ones)
    assert set(np.unique(out[y])) == {0.0, 2.0} and 0.4 < out[mask].mean() < 0.6
    assert np.array_equal(out[y] > 0, out[mask])
    assert np.array_equal(ex.eval().inference(ones)[y], ones["x"])


def test_input_gradients_micro_batches_and_intermediates():
    graphs = mlp(hidden=[32], seed=0), mlp(hidden=[32], seed=0)
    batch = _batch((1, 28, 28), 12)
    ref, ours = ReferenceExecutor(graphs[0]).train(), TorchExecutor(graphs[1]).train()
    for kwargs in ({"wrt": ["input", "fc0"]}, {"micro_batches": 3, "wrt": ["input"]}):
        v_ref, g_ref = ref.inference_and_backprop(batch, outputs=["logits"], **kwargs)
        v_ours, g_ours = ours.inference_and_backprop(batch, outputs=["logits"], **kwargs)
        assert list(g_ours) == list(g_ref)
        _assert_close(v_ours["loss"], v_ref["loss"], "loss")
        for name in g_ref:
            _assert_close(g_ours[name], g_ref[name], f"{name} with {kwargs}")
    # gradients are arrays of their own: a caller may add into them
    _, grads = ours.inference_and_backprop(batch)
    arrays = list(grads.values())
    assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays) for b in arrays[i + 1:])


def test_profile_records_nodes_and_the_backward_pass():
    ex = TorchExecutor(mlp(hidden=[8]), profile=True).train()
    ex.inference_and_backprop(_batch((1, 28, 28), 4))
    rows = {(r.op_type, r.phase) for r in ex.profile_table().rows}
    assert {("Gemm", "forward"), ("Relu", "forward"), ("(autograd)", "backward")} <= rows


def test_graph_arrays_stay_the_source_of_truth():
    """An optimizer's in-place step and a strategy's flat buffer are seen at the next call."""
    graph = mlp(hidden=[16], seed=0)
    ex = TorchExecutor(graph).train()
    batch = _batch((1, 28, 28), 4)
    flat = FlatBuffer.adopt(graph.parameters)  # as Level 3 strategies do
    before = ex.inference(batch)["loss"]
    flat.buffer *= 0.5
    assert graph.initializers["fc0.weight"].base is flat.buffer
    after = ex.inference(batch)["loss"]
    expected = ReferenceExecutor(graph).train().inference(batch)["loss"]
    assert after != before
    _assert_close(after, expected, "loss after the buffer changed")


# -- every kernel of the table against meta's own operator ----------------------------------

def _loss_graph(op_type, attrs, inputs, opset, n_outputs, weights):
    """One node, its float outputs folded into loss = sum_i <w_i, y_i>; inputs are fed."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    nodes = [Node(op_type, names, [f"y{i}" for i in range(n_outputs)], "op", attrs=dict(attrs))]
    total = None
    for i in weights:
        nodes += [Node("Mul", [f"y{i}", f"w{i}"], [f"m{i}"], f"mul{i}"),
                  Node("ReduceSum", [f"m{i}"], [f"s{i}"], f"sum{i}", attrs={"keepdims": 0})]
        if total is not None:
            nodes.append(Node("Add", [total, f"s{i}"], [f"t{i}"], f"add{i}"))
        total = f"t{i}" if total is not None else f"s{i}"
    nodes.append(Node("Identity", [total], ["loss"], "loss"))
    return Graph(nodes, [TensorInfo(n, x.dtype, x.shape) for n, x in zip(names, inputs) if n],
                 [TensorInfo(f"y{i}", None) for i in range(n_outputs)]
                 + [TensorInfo("loss", None, ())],
                 {f"w{i}": w for i, w in weights.items()}, {"": opset})


KERNEL_ENTRIES = [e for e in entries() if e.backend == "numpy" and e.domain == ""
                  and e.op_type in torch_ops.KERNELS
                  and e.since >= torch_ops.KERNELS[e.op_type].since]


@pytest.mark.parametrize("entry", KERNEL_ENTRIES, ids=[e.name for e in KERNEL_ENTRIES])
def test_every_torch_kernel_matches_meta_operator(entry):
    """Every registered version of every operator in the torch table, on every case of the
    operator library's tests (tests/lv0/cases*.py): outputs and input gradients equal meta's
    own operator's as written, in eval and in train mode (1e-9 in float64, 1e-6 / 1e-5 in
    float32; Dropout's training mask is random, so not compared)."""
    opset = _serving_opset(entry)
    rng = np.random.default_rng(0)
    for attrs, inputs in cases_for(entry.op_type, seed=3, opset=opset):
        op = entry.cls(**attrs)
        try:
            outputs = op.apply(Context(), *inputs)
        except Exception:  # a case that checks meta's error
            continue
        floats = {i: rng.standard_normal(np.shape(y)).astype(y.dtype)
                  for i, y in enumerate(outputs) if np.issubdtype(np.asarray(y).dtype, np.floating)}
        graph = _loss_graph(entry.op_type, attrs, inputs, opset, len(outputs), floats)
        feeds = {f"x{i}": x for i, x in enumerate(inputs) if x is not None}
        wrt = [f"x{i}" for i, x in enumerate(inputs) if x is not None and i not in
               op.no_grad_inputs and np.issubdtype(np.asarray(x).dtype, np.floating)]
        ref, ours = ReferenceExecutor(graph), TorchExecutor(graph)
        takes = torch_ops.KERNELS[entry.op_type].takes
        if takes is None or takes(op, graph.node("op")):  # else meta's op, on the host
            assert ours.placement()["op"] == "pytorch"
        for mode in (None, False, True):
            if mode is not None:
                ref.train(mode), ours.train(mode)
            if mode and entry.op_type == "Dropout":
                continue
            where = f"{entry.name} {attrs} train={mode}"
            if floats and wrt:
                v_ref, g_ref = ref.inference_and_backprop(feeds, wrt=wrt)
                v_ours, g_ours = ours.inference_and_backprop(feeds, wrt=wrt)
                for name in wrt:
                    tol = 1e-9 if g_ref[name].dtype == np.float64 else 1e-5
                    np.testing.assert_allclose(g_ours[name], g_ref[name], rtol=tol,
                                               atol=tol * 1e-2, err_msg=f"{where} d/d{name}")
            a = ref.inference(feeds, [f"y{i}" for i in range(len(outputs))])
            b = ours.inference(feeds, list(a))
            for name in a:
                assert np.asarray(b[name]).dtype == np.asarray(a[name]).dtype, where
                tol = 1e-9 if np.asarray(a[name]).dtype == np.float64 else 1e-6
                np.testing.assert_allclose(b[name], a[name], rtol=tol, atol=tol * 1e-3,
                                           err_msg=f"{where} {name}")


FIXTURES = sorted((REPO / "tests" / "fixtures" / "pytorch").glob("*.onnx"))


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_pytorch_exported_networks_match_the_reference(path):
    """Networks PyTorch exported (ResNet/MobileNet-style with BatchNorm, attention, GRU,
    LSTM, a transformer layer; TorchScript and dynamo exporters): outputs and the gradients
    of a weighted sum of the first output, in every mode."""
    # the executors must agree on the file as it is, including the default exports whose
    # folded BatchNorm the loader refuses to train as their source (as_exported: the user's call)
    graphs = from_onnx(path, as_exported=True), from_onnx(path, as_exported=True)
    rng = np.random.default_rng(0)
    feeds = {}
    for t in graphs[0].inputs:
        shape = [d if isinstance(d, int) else 2 for d in t.shape]
        feeds[t.name] = (rng.standard_normal(shape).astype(t.dtype)
                         if np.issubdtype(t.dtype, np.floating)
                         else rng.integers(0, 3, shape).astype(t.dtype))
    first = graphs[0].outputs[0].name
    y = ReferenceExecutor(graphs[0]).inference(feeds, [first])[first]
    weights = rng.standard_normal(y.shape).astype(y.dtype)
    for graph in graphs:
        graph.initializers["loss.w"] = weights.copy()
        graph.insert(Node("Mul", [first, "loss.w"], ["loss.m"], "loss.mul"))
        graph.insert(Node("ReduceSum", ["loss.m"], ["loss"], "loss.sum", attrs={"keepdims": 0}))
    wrt = [n for n, v in feeds.items() if np.issubdtype(v.dtype, np.floating)]
    ref, ours = ReferenceExecutor(graphs[0]), TorchExecutor(graphs[1])
    for mode in (None, True, False):
        if mode is not None:
            ref.train(mode), ours.train(mode)
        v_ref, g_ref = ref.inference_and_backprop(feeds, outputs=[first], wrt=wrt)
        v_ours, g_ours = ours.inference_and_backprop(feeds, outputs=[first], wrt=wrt)
        assert list(g_ours) == list(g_ref)
        _assert_close(v_ours[first], v_ref[first], f"{first} (train={mode})")
        for name in g_ref:
            _assert_close(g_ours[name], g_ref[name], f"d/d{name} (train={mode})")
        for name in graphs[0].state:
            _assert_close(graphs[1].state[name], graphs[0].state[name], name)


# -- user operators inside the PyTorch executor ---------------------------------------------

class ScaleCube(Operator):
    """y = x * gamma + 0.1 x^3 (gamma per feature): two differentiable inputs."""

    def forward(self, ctx, x, gamma):
        ctx.save(x=x, gamma=gamma)
        return x * gamma + 0.1 * x**3

    def backward(self, ctx, dy):
        x, gamma = ctx.x, ctx.gamma
        dx = dy * (gamma + 0.3 * x**2) if ctx.needs(0) else None
        dgamma = unbroadcast(dy * x, gamma.shape) if ctx.needs(1) else None
        return dx, dgamma


class RunningCenter(Operator):
    """y = x - mean over the batch (training) or the running mean (inference); the running
    mean is state, updated through update_state."""

    attributes = {"momentum": 0.5}
    no_grad_inputs = (1,)
    state_inputs = (1,)

    def forward(self, ctx, x, running):
        training = ctx.mode(False)
        mean = x.mean(axis=0) if training else running
        ctx.save(batch_mean=mean if training else None, training=training, n=len(x))
        return x - mean

    def backward(self, ctx, dy):
        return (dy - dy.mean(axis=0) if ctx.training else dy), None

    def update_state(self, ctx, running):
        if ctx.batch_mean is None:
            return None
        return (running * self.momentum + ctx.batch_mean * (1 - self.momentum),)


@pytest.fixture(scope="module")
def cpp_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("meta_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("META_CACHE_DIR", str(cache))
        build(SWISH)  # compiled once for the module
    return cache


@pytest.fixture
def user_ops(cpp_cache, monkeypatch):
    monkeypatch.setenv("META_CACHE_DIR", str(cpp_cache))
    with registry.scratch():
        register("ScaleCube", domain="test.torch")(ScaleCube)
        register("RunningCenter", domain="test.torch")(RunningCenter)
        register_cpp_op("Swish", SWISH, attributes={"beta": 1.0})
        yield


def _user_net(dtype=np.float64):
    """x -> Gemm -> ScaleCube (Python) -> Swish (C++) -> RunningCenter (Python, state) ->
    Gemm -> softmax cross-entropy."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("user_ops")
    x = b.input("x", dtype, ("N", 6))
    labels = b.input("labels", np.int64, ("N",))
    w1 = b.initializer("fc1.weight", rng.standard_normal((5, 6)).astype(dtype) * 0.5)
    b1 = b.initializer("fc1.bias", rng.standard_normal(5).astype(dtype) * 0.1)
    gamma = b.initializer("gamma", rng.uniform(0.5, 1.5, 5).astype(dtype))
    running = b.initializer("center.running", np.zeros(5, dtype))
    w2 = b.initializer("fc2.weight", rng.standard_normal((3, 5)).astype(dtype) * 0.5)
    b2 = b.initializer("fc2.bias", np.zeros(3, dtype))
    h = b.node("Gemm", [x, w1, b1], name="fc1", transB=1)
    h = b.node("ScaleCube", [h, gamma], name="cube", domain="test.torch")
    h = b.node("Swish", [h], name="swish", domain="ai.meta.custom", beta=1.5)
    h = b.node("RunningCenter", [h, running], name="center", domain="test.torch")
    logits = b.node("Gemm", [h, w2, b2], name="logits", transB=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss")
    b.output(logits, dtype, ("N", 3))
    b.output(loss, dtype, ())
    return b.build()


def _numeric_gradient(executor, feeds, target, index, eps=1e-6):
    """Central difference of the loss in one element of an initializer or a feed (float64)."""
    array = feeds[target] if target in feeds else executor.graph.initializers[target]
    saved = array[index]
    losses = []
    for delta in (eps, -eps):
        array[index] = saved + delta
        losses.append(float(executor.inference(feeds, ["loss"])["loss"]))
    array[index] = saved
    return (losses[0] - losses[1]) / (2 * eps)


ON_GPU = pytest.param("cuda", marks=[pytest.mark.gpu,
                                     pytest.mark.skipif(not CUDA, reason="no CUDA device")])


@pytest.mark.parametrize("device", ["cpu", ON_GPU])
def test_python_and_cpp_user_ops_run_inside_autograd_and_pass_a_gradient_check(user_ops, device):
    """On a GPU the user's ops run on the host (their inputs copied there and back)."""
    graph = _user_net()
    assert graph.roles["center.running"] == "state"
    ex = TorchExecutor(graph, device=device)
    placement = ex.placement()
    assert [placement[n] for n in ("fc1", "cube", "swish", "center", "logits", "loss")] == \
        ["pytorch", "host", "host", "host", "pytorch", "pytorch"]
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((7, 6)), "labels": rng.integers(0, 3, 7)}
    # Gradient check of the whole graph (as written: batch statistics, no state written).
    _, grads = ex.inference_and_backprop(feeds, wrt=["x"])
    assert sorted(grads) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "gamma", "x"]
    for name, grad in grads.items():
        for index in list(np.ndindex(grad.shape))[:: max(1, grad.size // 6)]:
            numeric = _numeric_gradient(ex, feeds, name, index)
            assert abs(grad[index] - numeric) <= 1e-6 * max(1.0, abs(numeric)), \
                f"d loss / d {name}{list(index)}: autograd {grad[index]:.9g}, " \
                f"central difference {numeric:.9g}"
    # The same numbers as the reference executor, in both modes, state updated alike.
    twin = _user_net()
    ref = ReferenceExecutor(twin)
    for mode in (True, False):
        ex.train(mode), ref.train(mode)
        v_ours, g_ours = ex.inference_and_backprop(feeds, outputs=["logits"], wrt=["x"])
        v_ref, g_ref = ref.inference_and_backprop(feeds, outputs=["logits"], wrt=["x"])
        _assert_close(v_ours["logits"], v_ref["logits"], f"logits (train={mode})", 1e-12)
        for name in g_ref:
            _assert_close(g_ours[name], g_ref[name], f"{name} (train={mode})", 1e-12)
        np.testing.assert_allclose(graph.state["center.running"], twin.state["center.running"],
                                   rtol=1e-12)
    assert np.abs(graph.state["center.running"]).max() > 0  # written by the training step


def test_control_flow_subgraphs_run_on_the_host_with_gradients():
    x = np.random.default_rng(1).standard_normal((3, 1, 3)).astype(np.float32)
    ref, ours = ReferenceExecutor(from_onnx(loop_model())), TorchExecutor(from_onnx(loop_model()))
    assert ours.placement()[next(n.name for n in ours.graph.nodes if n.op_type == "Loop")] \
        == "host"
    v_ref, g_ref = ref.inference_and_backprop({"x": x}, "loss", outputs=["hs"], wrt=["x"])
    v_ours, g_ours = ours.inference_and_backprop({"x": x}, "loss", outputs=["hs"], wrt=["x"])
    assert sorted(g_ours) == sorted(g_ref) == ["W", "b", "h0", "x"]
    _assert_close(v_ours["hs"], v_ref["hs"], "hs")
    for name in g_ref:
        _assert_close(g_ours[name], g_ref[name], f"gradient of {name}")


# -- errors and plumbing -------------------------------------------------------------------

def test_every_unknown_operator_is_named_when_the_executor_is_built():
    b = GraphBuilder("unknown")
    x = b.input("x", np.float32, ("N", 3))
    h = b.node("Frobnicate", [x], name="first", domain="my.ops")
    h = b.node("Relu", [h], name="fine")
    h = b.node("Defrobnicate", [h], name="second", domain="my.ops")
    b.output(h, np.float32, ("N", 3))
    with pytest.raises(GraphError) as err:
        TorchExecutor(b.build())
    message = str(err.value)
    assert "cannot run 2 node(s)" in message
    assert "'first' (Frobnicate)" in message and "'second' (Defrobnicate)" in message


def test_runtime_failure_names_the_node_and_its_inputs():
    b = GraphBuilder("bad")
    x = b.input("x", np.float32, ("N", 3))
    w = b.initializer("w", np.ones((4, 4), np.float32))
    b.output(b.node("MatMul", [x, w], name="mm"), np.float32, ("N", 4))
    with pytest.raises(Exception, match=r"node 'mm' \(MatMul\) failed on inputs "
                                        r"\(x: float32\[2, 3\], w: float32\[4, 4\]\)"):
        TorchExecutor(b.build()).inference({"x": np.ones((2, 3), np.float32)})


def test_recipe_component_device_option_and_errors(monkeypatch):
    component = EXECUTORS["pytorch"]
    assert "device" in component.options and component.options["device"].default == "cpu"
    assert component.check({"device": "cuda:1"}) == []
    assert "device' must be cpu, cuda or cuda:N" in component.check({"device": "gpu"})[0]
    executor = component.build(mlp(hidden=[4]), device="cpu")
    assert isinstance(executor, TorchExecutor) and executor.device.type == "cpu"
    if not CUDA:
        with pytest.raises(ComponentError, match="needs a CUDA GPU"):
            component.build(mlp(hidden=[4]), device="cuda")
    import meta.lv1.torch_executor as module

    monkeypatch.setattr(module, "torch_missing", lambda: "PyTorch is not installed (pip ...)")
    assert component.check({}) == ["executor 'pytorch': PyTorch is not installed (pip ...)"]


def test_import_meta_loads_neither_torch_nor_onnxruntime():
    code = ("import sys, meta, meta.lv1, meta.lv2, meta.run.runner; "
            "print(sorted(m for m in ('torch', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- GPU (skipped without CUDA; CI has none) ---------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_cuda_lenet_and_resnet_match_the_reference_and_write_state_back(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # full float32 convolutions
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    # ResNet-20 in float64, as on the CPU above: in float32 a ReLU input near 0 can round to
    # the other sign on another device and move a gradient by 1.8e-3 (seen on an H100).
    for model, shape, dtype in ((lenet5, (1, 28, 28), np.float32),
                                (resnet20, (3, 32, 32), np.float64)):
        ref_graph, gpu_graph = model(seed=2, dtype=dtype), model(seed=2, dtype=dtype)
        batch = _batch(shape, 8, dtype=dtype)
        ref = ReferenceExecutor(ref_graph).train()
        gpu = TorchExecutor(gpu_graph, device="cuda").train()
        v_ref, g_ref = ref.inference_and_backprop(batch)
        v_gpu, g_gpu = gpu.inference_and_backprop(batch)
        _assert_close(v_gpu["loss"], v_ref["loss"], "loss", 1e-4)
        for name in g_ref:
            assert isinstance(g_gpu[name], np.ndarray)
            _assert_close(g_gpu[name], g_ref[name], f"gradient of {name}", 1e-4)
        for name in ref_graph.state:
            _assert_close(gpu_graph.state[name], ref_graph.state[name], name, 1e-4)
        assert gpu.transfers["to_host_bytes"] >= sum(g.nbytes for g in g_gpu.values())
        assert gpu.transfers["to_device_bytes"] > 0
