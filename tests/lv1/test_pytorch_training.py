"""Networks exported by PyTorch train in meta exactly as they train in PyTorch.

The fixtures in ``tests/fixtures/pytorch`` (made by ``make_state_fixtures.py`` there, with
PyTorch 2.13; PyTorch itself is not needed here) hold a ResNet-style and a MobileNetV2-style
network (ReLU6 as Clip, depthwise convolutions) as both exporters write them, and what PyTorch
computed training them for 20 SGD steps (momentum 0.9, weight decay 5e-4, BatchNorm in
training mode), with everything trainable and with all but the classifier frozen.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import EXECUTORS, Graph, Node, TensorInfo, from_onnx
from meta.lv2 import Optimizer, sgd

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pytorch"
NETS = ("resnet", "mobilenet")
EXPORTS = ("torchscript", "dynamo", "dynamo_folded")
TOLERANCE = 1e-5
# The reference executor, and the planned one checked against PyTorch the same way.
EXECUTOR_NAMES = ("reference", "planned")


def load(net: str, export: str, **selection) -> Graph:
    """The exported network with a mean cross-entropy loss on its logits, as PyTorch's."""
    graph = from_onnx(FIXTURES / f"{net}_{export}.onnx", **selection)
    graph.inputs.append(TensorInfo("labels", np.int64, ("N",)))
    graph.insert(Node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"], "loss",
                      attrs={"reduction": "mean"}))
    graph.outputs.append(TensorInfo("loss", np.float32, ()))
    return graph


def reference(net: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"{net}_reference.npz") as data:
        return dict(data)


def train(graph: Graph, ref: dict[str, np.ndarray], executor: str = "reference") -> list[float]:
    executor = EXECUTORS[executor](graph).train()
    optimizer = Optimizer(sgd(0.05, momentum=0.9, weight_decay=5e-4), graph.parameters)
    losses = []
    for x, y in zip(ref["inputs"], ref["labels"]):
        values, grads = executor.inference_and_backprop({"input": x, "labels": y})
        losses.append(float(values["loss"]))
        optimizer.step(grads)
    return losses


def assert_matches(graph: Graph, ref: dict[str, np.ndarray], prefix: str) -> None:
    for name in [*graph.parameters, *graph.frozen, *graph.state]:
        np.testing.assert_allclose(graph.initializers[name], ref[f"{prefix}/{name}"], rtol=0,
                                   atol=TOLERANCE, err_msg=name)


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("net", NETS)
def test_twenty_sgd_steps_match_pytorch(net, export, executor):
    ref = reference(net)
    graph = load(net, export)
    torch_names = {k.split("/", 1)[1] for k in ref if k.startswith("final/")}
    # PyTorch's parameters and buffers, nothing else, are the graph's parameters and state.
    assert set(graph.parameters) | set(graph.state) == torch_names
    assert all("running_" in k for k in graph.state)
    constants = {k: v.copy() for k, v in graph.constants.items()}
    losses = train(graph, ref, executor)
    np.testing.assert_allclose(losses, ref["losses"], rtol=0, atol=TOLERANCE)
    assert_matches(graph, ref, "final")
    for name, value in constants.items():  # the exporter's constants are left alone
        np.testing.assert_array_equal(graph.initializers[name], value, err_msg=name)
    # Eval mode: the trained network with its running statistics, as PyTorch's model.eval().
    logits = EXECUTORS[executor](graph).eval().inference({"input": ref["inputs"][0]},
                                                         ["logits"])["logits"]
    np.testing.assert_allclose(logits, ref["final_logits_eval"], rtol=0, atol=1e-4)


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
@pytest.mark.parametrize("net", NETS)
def test_freezing_all_but_the_classifier_trains_only_the_classifier(net, executor):
    ref = reference(net)
    graph = load(net, "torchscript", trainable=["fc.*"])
    assert sorted(graph.parameters) == ["fc.bias", "fc.weight"]
    initial = {k: v.copy() for k, v in graph.frozen.items()}
    losses = train(graph, ref, executor)
    np.testing.assert_allclose(losses, ref["frozen_losses"], rtol=0, atol=TOLERANCE)
    assert_matches(graph, ref, "frozen_final")  # statistics still move, as in PyTorch
    for name, value in initial.items():
        assert np.array_equal(graph.initializers[name], value), name  # bit-identical


def test_constants_of_the_folded_dynamo_export_are_classified():
    graph = from_onnx(FIXTURES / "mobilenet_dynamo_folded.onnx")
    # ReLU6's bounds and the zero biases the exporter made are constants, not parameters.
    assert any(k.startswith("min_val_cast") for k in graph.constants)
    assert any(k.startswith("val_") for k in graph.constants)
    assert not any(k.startswith(("min_val", "max_val", "val_")) for k in graph.parameters)
