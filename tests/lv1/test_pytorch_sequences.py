"""Recurrent and attention networks exported by PyTorch load, compute and train in meta as in
PyTorch.

The fixtures in ``tests/fixtures/pytorch`` (made by ``make_sequence_fixtures.py`` there, with
PyTorch 2.13; PyTorch itself is not needed here) hold an LSTM and a GRU classifier, a
``nn.TransformerEncoderLayer`` model (GELU, no dropout) and a hand-written attention block, as
the TorchScript (opset 17) and dynamo (opset 20) exporters write them, with PyTorch's logits,
the gradients of the loss w.r.t. every parameter, and the losses of 20 SGD steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import EXECUTORS
from meta.lv2 import Optimizer, sgd

from .test_pytorch_training import EXECUTOR_NAMES, load, reference

NETS = ("lstm", "gru", "transformer", "attention")
EXPORTS = ("torchscript", "dynamo")
TOLERANCE = 1e-5


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("net", NETS)
def test_outputs_and_gradients_match_pytorch(net, export, executor):
    ref = reference(net)
    graph = load(net, export)
    torch_names = {k.split("/", 1)[1] for k in ref if k.startswith("initial/")}
    assert set(graph.parameters) == torch_names
    values, grads = EXECUTORS[executor](graph).train().inference_and_backprop(
        {"input": ref["inputs"][0], "labels": ref["labels"][0]}, outputs=["logits"])
    np.testing.assert_allclose(values["logits"], ref["logits0"], rtol=0, atol=TOLERANCE)
    for name in torch_names:
        np.testing.assert_allclose(grads[name], ref[f"grads0/{name}"], rtol=0, atol=TOLERANCE,
                                   err_msg=name)


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
@pytest.mark.parametrize("export", EXPORTS)
@pytest.mark.parametrize("net", NETS)
def test_twenty_sgd_steps_match_pytorch(net, export, executor):
    ref = reference(net)
    graph = load(net, export)
    executor = EXECUTORS[executor](graph).train()
    optimizer = Optimizer(sgd(0.1, momentum=0.9), graph.parameters)
    losses = []
    for x, y in zip(ref["inputs"], ref["labels"]):
        values, grads = executor.inference_and_backprop({"input": x, "labels": y})
        losses.append(float(values["loss"]))
        optimizer.step(grads)
    np.testing.assert_allclose(losses, ref["losses"], rtol=0, atol=TOLERANCE)
    for name in graph.parameters:
        np.testing.assert_allclose(graph.initializers[name], ref[f"final/{name}"], rtol=0,
                                   atol=TOLERANCE, err_msg=name)
