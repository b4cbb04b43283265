"""The layer API (meta.lv1.layers): shapes inferred, names, initialisations, the model
contract, every layer run against onnx.reference and trained, and the built-in builders
unchanged by their rewrite on it."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from meta.lv1 import PlannedExecutor, ReferenceExecutor, mlp, save_onnx
from meta.lv1.layers import (
    AvgPool,
    BatchNorm,
    Conv,
    Dropout,
    Embedding,
    Flatten,
    Gelu,
    GlobalAvgPool,
    LayerNorm,
    Linear,
    MaxPool,
    Op,
    Relu,
    Residual,
    Sequential,
    Sigmoid,
    Silu,
    Tanh,
)
from meta.lv1.models import lenet5, resnet20, vgg_small, wide_cnn


def lenet(input_shape=(1, 28, 28), classes=10, seed=0, dtype=np.float32):
    """LeNet-5 as a user writes it: the acceptance's 'at most 8 lines'."""
    return Sequential(Conv(6, 5, padding=2), Relu(), MaxPool(2), Conv(16, 5), Relu(), MaxPool(2),
                      Flatten(), Linear(120), Relu(), Linear(84), Relu(), Linear(classes),
                      ).graph(input_shape, classes, seed=seed, dtype=dtype)


def test_lenet_in_three_lines_has_the_contract_and_the_classic_parameters():
    graph = lenet()
    assert [(t.name, t.shape) for t in graph.inputs] == [("input", ("N", 1, 28, 28)),
                                                          ("labels", ("N",))]
    assert [(t.name, t.shape) for t in graph.outputs] == [("logits", ("N", 10)), ("loss", ())]
    shapes = {k: v.shape for k, v in graph.parameters.items()}
    assert shapes == {"conv1.weight": (6, 1, 5, 5), "conv1.bias": (6,),
                      "conv2.weight": (16, 6, 5, 5), "conv2.bias": (16,),
                      "fc1.weight": (120, 400), "fc1.bias": (120,), "fc2.weight": (84, 120),
                      "fc2.bias": (84,), "fc3.weight": (10, 84), "fc3.bias": (10,)}
    assert [n.name for n in graph.nodes][-2:] == ["logits", "loss"]
    assert graph.nodes[-1].op_type == "SoftmaxCrossEntropyLoss"
    logits = ReferenceExecutor(graph).inference(
        {"input": np.zeros((2, 1, 28, 28), np.float32)}, ["logits"])["logits"]
    assert logits.shape == (2, 10)


def test_pytorch_default_initialisation_and_he():
    graph = lenet(seed=4)
    for name, fan_in in (("conv1", 25), ("conv2", 150), ("fc1", 400), ("fc3", 84)):
        bound = 1 / math.sqrt(fan_in)
        for part in ("weight", "bias"):
            p = graph.parameters[f"{name}.{part}"]
            assert np.abs(p).max() <= bound and np.abs(p).max() > 0.8 * bound, (name, part)
    he = Sequential(Flatten(), Linear(50, init="he")).graph((4, 25), loss=None)
    w = he.parameters["fc1.weight"]
    assert np.abs(w).max() <= math.sqrt(6 / 100) and np.abs(w).max() > 0.8 * math.sqrt(6 / 100)
    assert not he.parameters["fc1.bias"].any()
    a, b = lenet(seed=1), lenet(seed=1)
    assert all(np.array_equal(a.parameters[k], b.parameters[k]) for k in a.parameters)
    assert not np.array_equal(a.parameters["conv1.weight"], lenet(seed=2).parameters[
        "conv1.weight"])


# Hashes of every initializer's name and bytes, taken from the builders as they were before
# their rewrite on the layer API (node lists, attributes and roles compared equal then too):
# checkpoints, recipes' accuracies and the determinism tests depend on these values.
BUILDERS = {
    "mlp": (mlp, {}, "783683c3dea5857a", ["flatten", "fc0", "relu0"]),
    "lenet5": (lenet5, {}, "cee7d6b57b37bec5", ["conv1", "relu1", "pool1"]),
    "resnet20": (resnet20, {"input_shape": (3, 8, 8), "width": 4}, "a4f05c12b507c22e",
                 ["conv0", "bn0", "relu0"]),
    "vgg_small": (vgg_small, {}, "14c522bfc75d41aa", ["conv1_1", "relu1_1", "conv1_2"]),
    "wide_cnn": (wide_cnn, {}, "dd1738a4d6cb1a69", ["conv1", "relu1", "conv2"]),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_builders_on_the_layer_api_keep_their_parameters_bit_for_bit(name):
    build, kwargs, digest, first = BUILDERS[name]
    graph = build(**kwargs)
    h = hashlib.sha256()
    for key, value in graph.initializers.items():
        h.update(key.encode())
        h.update(value.tobytes())
    assert h.hexdigest()[:16] == digest
    assert [n.name for n in graph.nodes][:3] == first
    assert [t.name for t in graph.outputs] == ["logits", "loss"]


def test_resnet_blocks_are_named_in_their_scope():
    graph = resnet20(input_shape=(3, 8, 8), width=4)
    names = [n.name for n in graph.nodes]
    assert names[3:13] == ["s1b1.conv1", "s1b1.bn1", "s1b1.relu1", "s1b1.conv2", "s1b1.bn2",
                           "s1b1.add", "s1b1.relu2", "s1b2.conv1", "s1b2.bn1", "s1b2.relu1"]
    assert "s2b1.proj.weight" in graph.parameters and "s2b1.proj_bn.running_var" in graph.state
    assert graph.parameters["logits.weight"].shape == (10, 16)


# Every layer, in a small model: the graph must pass ONNX's checker and onnx.reference must give
# meta's logits.
MODELS = {
    "conv2d_stride_groups": (Sequential(Conv(4, 3, stride=2, padding=1), Relu(),
                                        Conv(8, 3, groups=2, padding=(1, 0)), Tanh(),
                                        AvgPool(2, padding=1), Flatten(), Linear(5)), (2, 9, 9)),
    "conv1d": (Sequential(Conv(6, 3, padding=1), Sigmoid(), MaxPool(2), Conv(8, 2, dilation=2),
                          Flatten(), Linear(3)), (3, 12)),
    "residual_bn": (Sequential(Conv(4, 3, padding=1, bias=False), BatchNorm(), Relu(),
                               Residual(Conv(4, 3, padding=1), BatchNorm(), Relu(),
                                        Conv(4, 3, padding=1)),
                               Residual(Conv(6, 3, stride=2, padding=1),
                                        shortcut=Conv(6, 1, stride=2)),
                               Relu(), GlobalAvgPool(), Flatten(), Linear(4)), (3, 8, 8)),
    "mlp_ln_gelu_dropout": (Sequential(Flatten(), Linear(16), LayerNorm(), Gelu(), Dropout(0.3),
                                       Linear(16), Silu(), Op("Elu", alpha=0.5), Linear(3)),
                            (2, 5)),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_layer_exports_and_onnx_reference_agrees(name, tmp_path):
    net, shape = MODELS[name]
    graph = net.graph(shape, seed=1)
    path = save_onnx(graph, tmp_path / f"{name}.onnx", outputs=["logits"])
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    x = np.random.default_rng(0).standard_normal((3, *shape)).astype(np.float32)
    ours = ReferenceExecutor(graph).inference({"input": x}, ["logits"])["logits"]
    theirs = ReferenceEvaluator(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_layer_trains_and_the_planned_executor_agrees(name):
    """Gradients reach every parameter (the loss on one batch falls), and the planned
    executor computes the reference executor's loss and gradients."""
    net, shape = MODELS[name]
    graph = net.graph(shape, seed=1)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((8, *shape)).astype(np.float32),
             "labels": rng.integers(0, 3, 8)}
    ref = ReferenceExecutor(graph).eval()
    planned = PlannedExecutor(graph).eval()
    v1, g1 = ref.inference_and_backprop(feeds)
    v2, g2 = planned.inference_and_backprop(feeds)
    np.testing.assert_allclose(v2["loss"], v1["loss"], rtol=1e-4)
    for key in g1:
        assert np.abs(g1[key]).max() > 0, key
        np.testing.assert_allclose(g2[key], g1[key], rtol=1e-3, atol=1e-5, err_msg=key)
    ex = ReferenceExecutor(graph).train()
    losses = []
    for _ in range(40):
        values, grads = ex.inference_and_backprop(feeds)
        losses.append(float(values["loss"]))
        for key, g in grads.items():
            graph.parameters[key] -= 0.3 * g
    assert losses[-1] < 0.7 * losses[0], losses


def test_gelu_before_and_after_opset_20_computes_the_same():
    x = {"input": np.linspace(-3, 3, 12, dtype=np.float32).reshape(2, 6)}
    old = Sequential(Gelu()).graph((6,), loss=None)
    new = Sequential(Gelu()).graph((6,), loss=None, opset=20)
    assert [n.op_type for n in new.nodes] == ["Gelu"] and len(old.nodes) == 5
    np.testing.assert_allclose(ReferenceExecutor(old).inference(x)["logits"],
                               ReferenceExecutor(new).inference(x)["logits"], rtol=1e-5, atol=1e-6)


def test_embedding_reads_int64_indices():
    graph = Sequential(Embedding(20, 4), Flatten(), Linear(3)).graph(
        (5,), seed=0, input_dtype=np.int64)
    assert graph.parameters["embedding1.weight"].shape == (20, 4)
    values, grads = ReferenceExecutor(graph).inference_and_backprop(
        {"input": np.arange(10).reshape(2, 5), "labels": np.array([0, 2])})
    assert grads["embedding1.weight"][:10].any() and not grads["embedding1.weight"][10:].any()


def test_state_and_constants_are_not_parameters():
    graph = Sequential(Conv(3, 3), BatchNorm(), Flatten(), Dropout(0.1), Linear(2)).graph(
        (1, 5, 5))
    assert set(graph.state) == {"bn1.running_mean", "bn1.running_var"}
    assert graph.roles["dropout1.ratio"] == "constant"
    assert "bn1.weight" in graph.parameters


@pytest.mark.parametrize("net, shape, message", [
    (Sequential(Conv(4, 5), MaxPool(2), Conv(4, 5)), (1, 8, 8),
     r"model: input shape \[1, 8, 8\] is too small .*conv2 gives \[4, -2, -2\]"),
    (Sequential(Conv(4, 3), Linear(3)), (1, 8, 8), "fc1: Linear takes .*put Flatten"),
    (Sequential(Conv(4, 3, groups=3)), (2, 8, 8), "conv1: 2 input and 4 output channels"),
    # a size argument of 0 is blamed on itself, not on the input size (issue 44)
    (Sequential(Conv(0, 3)), (1, 8, 8), "model: conv1: out_channels must be an integer >= 1, "
     "got 0"),
    (Sequential(Conv(4, 0)), (1, 8, 8), "conv1: kernel_size must be an integer >= 1, got 0"),
    (Sequential(Conv(4, 3, stride=(1, 0))), (1, 8, 8), "conv1: stride must be an integer"),
    (Sequential(Conv(4, 3, groups=0)), (1, 8, 8), "conv1: groups must be an integer >= 1"),
    (Sequential(Flatten(), Linear(0)), (3,), "fc1: out_features must be an integer >= 1, "
     "got 0"),
    (Sequential(Residual(Conv(4, 3, padding=1), name="block")), (2, 8, 8),
     r"block: the block gives \[4, 8, 8\] and its shortcut \[2, 8, 8\]"),
    (Sequential(Flatten(), Linear(4)), (3,), "the last layer gives \\[4\\] .* not the 10"),
    (Sequential(Flatten(), Linear(4, name="fc1"), Linear(10)), (3,),
     "model: two layers are named 'fc1'"),
])
def test_shape_errors_name_the_layer(net, shape, message):
    with pytest.raises(ValueError, match=message):
        net.graph(shape, classes=10)


def test_a_class_instead_of_an_instance_is_refused():
    with pytest.raises(TypeError, match="item 1 is type, not a layer"):
        Sequential(Flatten(), Relu)
