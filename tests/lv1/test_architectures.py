"""Six architectures users bring, exported with ``torch.onnx.export(model, args)``'s defaults,
train on the planned executor as they train in PyTorch, every node inside the plan (issue 41).

The fixtures in ``tests/fixtures/pytorch/architectures`` (made by
``make_architecture_fixtures.py``, with PyTorch 2.13; PyTorch is not needed here): a GPT-2
(tanh-GELU), a Llama with a tied and with an untied head (RoPE, RMSNorm, SwiGLU, grouped-query
attention), a T5 encoder (relative position bias), a ViT, a ConvNeXt and a MobileNetV3
(hardswish, squeeze-excite, BatchNorm), and what PyTorch computed training each: 20 SGD steps
with momentum and weight decay. Each file is loaded as a user's file is (the ``onnx`` model
component: the file and a mean cross-entropy on its output). Two default exports cannot train
as PyTorch does (``REFUSED``): meta refuses them in one line, and their exports without the
exporter's optimizer train instead.

Where the plan leaves a node to Python (``placement()`` says "python"), the step pays
numpy's speed for it; issue 41 asks that none do. The test says which nodes still do, and
is an expected failure (strict) until the plan covers them, so covering them shows here.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from meta.lv1 import PlannedExecutor, from_onnx
from meta.lv1.onnx_io import ONNXLoadError
from meta.lv1.onnx_model import onnx_model
from meta.lv1.plan.profile_share import python_placement
from meta.lv2 import Optimizer, sgd

from .test_pytorch_training import FIXTURES

FOLDER = FIXTURES / "architectures"
NAMES = ("gpt2", "llama_tied", "llama_untied", "t5", "vit", "convnext", "mobilenetv3")
TOLERANCE = 1e-5
# The export that trains: the defaults, but two defaults cannot train as PyTorch does and
# meta refuses them in one line (tested below): MobileNetV3's folds BatchNorm into the
# convolutions, T5's gathers its relative position bias table into one copy per (query, key)
# pair. Their dynamo exports without the optimizer stand in.
REFUSED = {"mobilenetv3": "folded BatchNorm", "t5": "gathered parameter"}
TRAINED = {name: "dynamo" if name in REFUSED else "default" for name in NAMES}
# Nodes the planned executor still runs as Python steps, per model (none at this commit);
# strict, so a model the plan comes to cover fails here.
PYTHON_STEPS: dict[str, str] = {}


def info(name: str) -> dict:
    return json.loads((FOLDER / f"{name}.json").read_text())


def reference(name: str) -> dict[str, np.ndarray]:
    with np.load(FOLDER / f"{name}_reference.npz") as data:
        return dict(data)


def load(name: str, export: str):
    """The file as the ``onnx`` model component loads a user's file: with ``labels`` and
    the mean cross-entropy ``loss`` on its output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx_model((), 0, 0, np.float32, str(FOLDER / f"{name}_{export}.onnx"))


def train(graph, ref: dict[str, np.ndarray], input_name: str) -> tuple[list[float], dict]:
    """20 steps of PyTorch's SGD on the planned executor; the losses and the placement."""
    run = PlannedExecutor(graph).train()
    optimizer = Optimizer(sgd(0.05, momentum=0.9, weight_decay=5e-4), graph.parameters)
    losses = []
    for x, y in zip(ref["inputs"], ref["labels"]):
        values, grads = run.inference_and_backprop({input_name: x, "labels": y})
        losses.append(float(values["loss"]))
        optimizer.step(grads)
    assert run.unplanned is None, run.unplanned
    return losses, run.placement()


def python_nodes(graph, placement: dict[str, str]) -> list[str]:
    """"op_type node (placement)" of each node the plan runs as a Python step."""
    ops = {n.name: n.op_type for n in graph.nodes}
    return sorted(f"{ops.get(n, '?')} {n} ({where})" for n, where in placement.items()
                  if python_placement(where))


def case(name: str, check: str):
    marks = [pytest.mark.slow] if check == "train" else []  # 20 steps: 1-6 s each
    if check == "plan" and name in PYTHON_STEPS:
        marks.append(pytest.mark.xfail(strict=True, reason=PYTHON_STEPS[name]))
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [case(n, "train") for n in NAMES])
def test_twenty_sgd_steps_on_the_planned_executor_match_pytorch(name):
    export = TRAINED[name]
    described = info(name)["exports"][export]
    ref = reference(name)
    graph = load(name, export)
    # PyTorch's parameters, each once: a tied one is one tensor, a merged one apart again, a
    # folded expand (ViT's class token) restored; each has PyTorch's final value.
    assert len(graph.parameters) == len(info(name)["torch_parameters"])
    assert {other for _, other, _ in described["ties"]} <= set(graph.ties)
    finals = {k: ref.get(f"{export}/final/{k}", ref.get(f"torch/final/{k}"))
              for k in graph.parameters}
    assert [k for k, v in finals.items() if v is None] == []
    losses, _ = train(graph, ref, described["input"])
    np.testing.assert_allclose(losses, ref["losses"], rtol=0, atol=TOLERANCE)
    for name_, final in finals.items():
        np.testing.assert_allclose(graph.initializers[name_], final, rtol=0, atol=TOLERANCE,
                                   err_msg=name_)
    for name_ in graph.state:
        np.testing.assert_allclose(graph.initializers[name_], ref[f"final_state/{name_}"],
                                   rtol=0, atol=TOLERANCE, err_msg=name_)


@pytest.mark.parametrize("name", [case(n, "plan") for n in NAMES])
def test_every_node_runs_inside_the_plan(name):
    """No node left to a Python step (then Python's share of a step is nil: issue 41 asks for
    at most 2 %; the share itself is timed by ``benchmarks/architectures.py``)."""
    export = TRAINED[name]
    graph = load(name, export)
    ref = reference(name)
    x = {info(name)["exports"][export]["input"]: ref["inputs"][0]}
    run = PlannedExecutor(graph).train()
    run.inference_and_backprop({**x, "labels": ref["labels"][0]})
    assert run.unplanned is None, run.unplanned
    assert python_nodes(graph, run.placement()) == []
    inference = PlannedExecutor(graph).eval()  # the inference plan (eval mode) too
    inference.inference(x, [graph.outputs[0].name])
    assert inference.unplanned is None, inference.unplanned
    assert python_nodes(graph, inference.placement()) == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_default_export_that_cannot_train_as_pytorch_is_refused_in_one_line(name):
    """``torch.onnx.export``'s optimizer folds MobileNetV3's BatchNorm into the convolutions
    with the running statistics even from train mode (PyTorch trains them apart), and T5's
    relative position bias ``table[buckets]`` of the fixed sequence into a (1, H, T, T)
    initializer (PyTorch trains the table, each row shared by many pairs): meta refuses both
    files, naming the remedy."""
    assert info(name)["exports"]["default"]["folded_batchnorm"] == (name == "mobilenetv3")
    with pytest.raises(ONNXLoadError, match="cannot train as its source did") as caught:
        from_onnx(FOLDER / f"{name}_default.onnx")
    line = str(caught.value)
    assert REFUSED[name] in line
    assert "\n" not in line and "optimize=False" in line and "as_exported=True" in line
