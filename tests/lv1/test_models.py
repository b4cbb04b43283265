"""The convolutional model builders: shapes, ONNX export, onnx.reference parity, training."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from meta.lv1 import ReferenceExecutor, save_onnx, to_onnx
from meta.lv1.models import MODELS, lenet5, resnet20, vgg_small, wide_cnn

# Small inputs keep this fast; the builders work out their own flatten widths.
SHAPES = {"lenet": (1, 28, 28), "resnet20": (3, 16, 16), "vgg_small": (3, 16, 16),
          "wide_cnn": (1, 12, 12)}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_exports_and_onnx_reference_gives_the_same_logits(name, tmp_path):
    shape = SHAPES[name]
    graph = MODELS[name](input_shape=shape, classes=7, seed=3)
    path = save_onnx(graph, tmp_path / f"{name}.onnx", outputs=["logits"])
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    x = np.random.default_rng(0).standard_normal((3, *shape)).astype(np.float32)
    ours = ReferenceExecutor(graph).inference({"input": x}, ["logits"])["logits"]
    theirs = ReferenceEvaluator(str(path)).run(None, {"input": x})[0]
    assert ours.shape == (3, 7) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


def test_lenet5_is_the_classic_layout():
    graph = lenet5()
    params = graph.parameters
    assert params["conv1.weight"].shape == (6, 1, 5, 5)
    assert params["conv2.weight"].shape == (16, 6, 5, 5)
    assert [params[f"{n}.weight"].shape for n in ("fc1", "fc2", "logits")] == \
        [(120, 400), (84, 120), (10, 84)]
    assert sum(p.size for p in params.values()) == 61706
    assert [n.op_type for n in graph.nodes].count("MaxPool") == 2


def test_builders_are_seeded():
    a, b, c = wide_cnn(seed=1), wide_cnn(seed=1), wide_cnn(seed=2)
    assert all(np.array_equal(a.parameters[k], b.parameters[k]) for k in a.parameters)
    assert not np.array_equal(a.parameters["conv1.weight"], c.parameters["conv1.weight"])


def test_resnet20_has_twenty_weighted_layers_and_inference_mode_batch_norm():
    graph = resnet20(input_shape=(3, 8, 8), width=4)
    convs = [n for n in graph.nodes if n.op_type == "Conv" and not n.name.endswith(".proj")]
    assert len(convs) + 1 == 20  # 19 convolutions and the classifier
    assert {n.attrs.get("training_mode", 0) for n in graph.nodes
            if n.op_type == "BatchNormalization"} == {0}
    assert len(graph.state) == 42 and not any("running" in k for k in graph.parameters)
    to_onnx(graph, outputs=["logits"])


def test_too_small_an_input_is_refused_by_name():
    with pytest.raises(ValueError, match="vgg_small: input shape"):
        vgg_small(input_shape=(3, 4, 4))


@pytest.mark.parametrize("name", ["lenet", "resnet20"])
def test_a_few_sgd_steps_fit_one_batch(name):
    """Gradients flow through every layer: the loss on a fixed batch falls."""
    shape = SHAPES[name]
    graph = MODELS[name](input_shape=shape, seed=0)
    ex = ReferenceExecutor(graph).train()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((8, *shape)).astype(np.float32),
             "labels": rng.integers(0, 10, 8)}
    losses = []
    for _ in range(8):
        values, grads = ex.inference_and_backprop(feeds)
        losses.append(float(values["loss"]))
        assert grads.keys() == graph.parameters.keys()  # running statistics get none
        for k, g in grads.items():
            graph.parameters[k] -= 0.05 * g
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_lstm_reads_rows_and_learns_one_batch():
    from meta.lv1 import lstm

    graph = lstm(input_shape=(1, 6, 5), classes=3, hidden=8, seed=1)
    assert {k: v.shape for k, v in graph.parameters.items()} == {
        "lstm.W": (1, 32, 5), "lstm.R": (1, 32, 8), "lstm.B": (1, 64), "fc.weight": (3, 8),
        "fc.bias": (3,)}
    ex = ReferenceExecutor(graph).train()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((12, 1, 6, 5)).astype(np.float32),
             "labels": rng.integers(0, 3, 12)}
    losses = []
    for _ in range(30):
        values, grads = ex.inference_and_backprop(feeds)
        losses.append(float(values["loss"]))
        for k, g in grads.items():
            graph.parameters[k] -= 0.5 * g
    assert losses[-1] < 0.5 * losses[0], losses
