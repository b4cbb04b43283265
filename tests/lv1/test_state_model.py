"""The state model: parameters, state and constants; train and eval mode; freezing; input
gradients; one owner of the parameter storage."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, ReferenceExecutor, from_onnx, mlp, resnet20, to_onnx
from meta.lv1.roles import CONSTANT, PARAMETER, STATE


def _bn_net(dtype=np.float64, training_form: bool = False):
    """x -> Conv -> BatchNormalization -> Clip(0, 6) -> / 2 (a 0-d divisor) -> mean -> loss."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("bn_net")
    x = b.input("x", dtype, ("N", 2, 4, 4))
    w = b.initializer("conv.weight", rng.standard_normal((3, 2, 3, 3)).astype(dtype))
    stats = [b.initializer(f"bn.{k}", np.asarray(v, dtype)) for k, v in
             (("weight", [1.0, 0.5, 2.0]), ("bias", [0.0, 0.1, -0.1]),
              ("running_mean", [0.0, 0.0, 0.0]), ("running_var", [1.0, 1.0, 1.0]))]
    h = b.node("Conv", [x, w], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    outputs = ["bn", "bn.mean_out", "bn.var_out"] if training_form else None
    h = b.node("BatchNormalization", [h, *stats], name="bn", outputs=outputs,
               momentum=0.9, **({"training_mode": 1} if training_form else {}))
    h = h[0] if isinstance(h, list) else h
    lo, hi = b.initializer("clip.min", np.asarray(0.0, dtype)), b.initializer(
        "clip.max", np.asarray(6.0, dtype))
    h = b.node("Clip", [h, lo, hi], name="relu6")
    h = b.node("Div", [h, b.initializer("two", np.asarray(2.0, dtype))], name="half")
    shape = b.initializer("shape", np.array([0, -1], np.int64))
    h = b.node("Reshape", [h, shape], name="flat")
    loss = b.node("ReduceMean", [b.node("Mul", [h, h], name="sq")], name="loss", keepdims=0)
    b.output(h, dtype, ("N", 48))
    b.output(loss, dtype, ())
    return b.build()


def test_initializers_are_classified_by_the_ops_that_read_them():
    g = _bn_net()
    assert g.roles == {"conv.weight": PARAMETER, "bn.weight": PARAMETER, "bn.bias": PARAMETER,
                       "bn.running_mean": STATE, "bn.running_var": STATE,
                       "clip.min": CONSTANT, "clip.max": CONSTANT, "two": CONSTANT,
                       "shape": CONSTANT}
    assert list(g.parameters) == ["conv.weight", "bn.weight", "bn.bias"]
    assert list(g.state) == ["bn.running_mean", "bn.running_var"]
    assert set(g.constants) == {"clip.min", "clip.max", "two", "shape"}
    # The classification survives the trip through ONNX.
    assert from_onnx(to_onnx(g, training=True)).roles == g.roles


def test_overrides_by_pattern_freeze_unfreeze_and_train_only():
    g = _bn_net()
    assert g.freeze("bn.*") == ["bn.weight", "bn.bias"]
    assert list(g.parameters) == ["conv.weight"] and list(g.frozen) == ["bn.weight", "bn.bias"]
    assert list(g.state) == ["bn.running_mean", "bn.running_var"]  # state stays state
    g.unfreeze("bn.bias", "two")  # a learned 0-d scale is made trainable by name
    assert list(g.parameters) == ["conv.weight", "bn.bias", "two"]
    assert g.train_only("conv.*") == ["conv.weight"]
    assert list(g.parameters) == ["conv.weight"]
    with pytest.raises(KeyError, match="pattern 'cnv.*' matches no initializer"):
        g.freeze("cnv.*")


def test_parameters_view_writes_the_graph_and_keeps_its_names():
    g = _bn_net()
    params = g.parameters
    replacement = np.zeros_like(params["conv.weight"])
    params["conv.weight"] = replacement
    assert g.initializers["conv.weight"] is replacement
    g.freeze("conv.*")
    assert "conv.weight" in params  # an optimizer's set is fixed when it is made
    with pytest.raises(KeyError, match="not a parameter"):
        params["bn.running_mean"] = np.zeros(3)
    with pytest.raises(ValueError, match="does not fit"):
        params["bn.bias"] = np.zeros(4)


def _feeds(n=6, seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((n, 2, 4, 4))}


@pytest.mark.parametrize("training_form", [False, True])
def test_train_mode_updates_running_statistics_like_pytorch(training_form):
    g = _bn_net(training_form=training_form)
    ex = ReferenceExecutor(g).train()
    feeds = _feeds()
    conv = ex.inference(feeds, ["conv", "bn"])["conv"]  # in training mode BN updates its state
    mean = conv.mean(axis=(0, 2, 3))
    unbiased = conv.var(axis=(0, 2, 3), ddof=1)  # PyTorch's running_var takes n / (n - 1)
    m = float(np.float32(0.9))  # ONNX stores the momentum attribute as a float32
    np.testing.assert_allclose(g.state["bn.running_mean"], (1 - m) * mean, rtol=1e-12)
    np.testing.assert_allclose(g.state["bn.running_var"], m + (1 - m) * unbiased, rtol=1e-12)
    before = {k: v.copy() for k, v in g.state.items()}
    ex.inference_and_backprop(feeds)  # a training step updates them again, in place
    assert not np.allclose(before["bn.running_mean"], g.state["bn.running_mean"])
    # Eval mode normalises with the stored statistics and writes nothing.
    ex.eval()
    stored = {k: v.copy() for k, v in g.state.items()}
    y = ex.inference(feeds, ["bn"])["bn"]
    expected = (conv - stored["bn.running_mean"][:, None, None]) / np.sqrt(
        stored["bn.running_var"][:, None, None] + 1e-5) * g.initializers["bn.weight"][
        :, None, None] + g.initializers["bn.bias"][:, None, None]
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-9)
    assert all(np.array_equal(v, g.state[k]) for k, v in stored.items())


def test_as_written_mode_is_onnx_functional_and_writes_no_state():
    g = _bn_net(training_form=True)
    ex = ReferenceExecutor(g)  # neither train() nor eval(): each node as written
    out = ex.inference(_feeds(), ["bn.mean_out"])
    assert np.abs(out["bn.mean_out"]).max() > 0  # the spec's running output is computed ...
    assert not g.state["bn.running_mean"].any()  # ... and the graph's state is untouched


def test_dropout_follows_the_executor_mode():
    b = GraphBuilder("drop")
    x = b.input("x", np.float32, (1000,))
    b.output(b.node("Dropout", [x, b.initializer("ratio", np.asarray(0.5, np.float32))],
                    name="d"), np.float32, (1000,))
    g = b.build()
    assert g.roles["ratio"] == CONSTANT
    ex = ReferenceExecutor(g)
    ones = {"x": np.ones(1000, np.float32)}
    assert np.array_equal(ex.eval().inference(ones)["d"], ones["x"])
    dropped = ex.train().inference(ones)["d"]
    assert set(np.unique(dropped)) == {0.0, 2.0} and 350 < np.count_nonzero(dropped) < 650


def test_gradients_go_to_trainable_parameters_only():
    g = _bn_net()
    g.freeze("bn.weight")
    _, grads = ReferenceExecutor(g).train().inference_and_backprop(_feeds())
    assert set(grads) == {"conv.weight", "bn.bias"}


def test_input_gradient_of_a_whole_network_matches_finite_differences():
    """float64 ResNet-20 (BatchNorm in training mode): d loss / d input, central differences."""
    graph = resnet20(input_shape=(3, 6, 6), width=2, dtype=np.float64, seed=3)
    ex = ReferenceExecutor(graph).train()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((3, 3, 6, 6)), "labels": rng.integers(0, 10, 3)}
    _, grads = ex.inference_and_backprop(feeds, wrt=["input"])
    assert grads["input"].shape == feeds["input"].shape and "labels" not in grads
    flat = feeds["input"].reshape(-1)
    eps = 1e-6
    for j in rng.choice(flat.size, 24, replace=False):
        saved = flat[j]
        flat[j] = saved + eps
        up = float(ex.inference(feeds, ["loss"])["loss"])
        flat[j] = saved - eps
        down = float(ex.inference(feeds, ["loss"])["loss"])
        flat[j] = saved
        np.testing.assert_allclose(grads["input"].reshape(-1)[j], (up - down) / (2 * eps),
                                   rtol=1e-5, atol=1e-9)


def test_input_gradient_with_micro_batches_is_the_full_batch_one():
    graph = mlp(hidden=[8], dtype=np.float64)
    ex = ReferenceExecutor(graph)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((6, 1, 28, 28)), "labels": rng.integers(0, 10, 6)}
    _, whole = ex.inference_and_backprop(feeds, wrt=["input"])
    _, parts = ex.inference_and_backprop(feeds, wrt=["input"], micro_batches=3)
    np.testing.assert_allclose(parts["input"], whole["input"], rtol=1e-10, atol=1e-15)
    with pytest.raises(Exception, match="wrt"):
        ex.inference_and_backprop(feeds, wrt=["nope"])


def test_export_is_written_for_inference_with_the_trained_statistics():
    g = _bn_net(training_form=True)
    ReferenceExecutor(g).train().inference(_feeds())
    model = to_onnx(g, outputs=["loss"])
    (bn,) = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bn.output) == 1 and not [a for a in bn.attribute if a.name == "training_mode"]
    saved = {t.name: t for t in model.graph.initializer}
    from onnx import numpy_helper

    np.testing.assert_array_equal(numpy_helper.to_array(saved["bn.running_mean"]),
                                  g.state["bn.running_mean"])
    kept = to_onnx(g, training=True)
    (bn,) = [n for n in kept.graph.node if n.op_type == "BatchNormalization"]
    assert len(bn.output) == 3


def test_onnxruntime_reproduces_eval_mode_predictions():
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is an optional extra")
    graph = resnet20(input_shape=(3, 8, 8), width=4, seed=2)
    ex = ReferenceExecutor(graph).train()
    rng = np.random.default_rng(0)
    for _ in range(3):  # move the running statistics away from (0, 1)
        ex.inference({"input": rng.standard_normal((16, 3, 8, 8)).astype(np.float32) + 0.5},
                     ["logits"])
    x = rng.standard_normal((16, 3, 8, 8)).astype(np.float32) + 0.5
    mine = ex.eval().inference({"input": x}, ["logits"])["logits"]
    session = ort.InferenceSession(to_onnx(graph, outputs=["logits"]).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    theirs = session.run(["logits"], {"input": x})[0]
    np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert np.array_equal(mine.argmax(1), theirs.argmax(1))
