"""The onnxruntime executor: meta's eval-mode numbers through an InferenceSession, current
weights after training steps, inference only, errors named. Skipped without onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed "
                                          "(pip install 'meta[onnxruntime]')")

from meta.lv1 import (  # noqa: E402
    EXECUTORS,
    ExecutionError,
    GraphBuilder,
    GraphError,
    OnnxRuntimeExecutor,
    ReferenceExecutor,
    lenet5,
    mlp,
    resnet20,
)
from meta.lv2 import Optimizer, sgd  # noqa: E402


def _batch(shape, n=8, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((n, *shape)).astype(np.float32),
            "labels": rng.integers(0, 10, n).astype(np.int64)}


@pytest.mark.parametrize("build, shape", [(mlp, (1, 28, 28)), (lenet5, (1, 28, 28)),
                                          (resnet20, (3, 32, 32))],
                         ids=["mlp", "lenet5", "resnet20"])
def test_inference_equals_meta_eval_mode_and_follows_training(build, shape):
    graph = build(seed=0)
    reference = ReferenceExecutor(graph)
    ort = OnnxRuntimeExecutor(graph).eval()
    optimizer = Optimizer(sgd(0.05, momentum=0.9), graph.parameters)
    batch = _batch(shape)
    for step in range(3):  # every evaluation sees the weights and statistics of that moment
        ours = reference.eval().inference(batch)
        theirs = ort.inference(batch)
        np.testing.assert_allclose(theirs["logits"], ours["logits"], rtol=1e-4, atol=2e-5)
        np.testing.assert_allclose(theirs["loss"], ours["loss"], rtol=1e-5)
        assert np.array_equal(theirs["logits"].argmax(1), ours["logits"].argmax(1))
        _, grads = reference.train().inference_and_backprop(_batch(shape, seed=step + 1))
        optimizer.step(grads)  # moves parameters (and resnet20's running statistics)
    ort.inference(batch)  # the last step changed the weights: a new session
    built = ort.sessions_built
    ort.inference(batch)
    assert ort.sessions_built == built  # unchanged weights: the session is kept


def test_inference_only_and_training_mode():
    ort = OnnxRuntimeExecutor(resnet20((3, 8, 8), width=4))
    with pytest.raises(ExecutionError, match="inference only"):
        ort.inference_and_backprop(_batch((3, 8, 8)))
    with pytest.raises(ExecutionError, match=r"inference only: call eval\(\).*BatchNorm"):
        ort.train().inference(_batch((3, 8, 8)))
    mlp_ort = OnnxRuntimeExecutor(mlp(hidden=[8])).train()  # nothing differs in training
    assert mlp_ort.inference(_batch((1, 28, 28)), ["logits"])["logits"].shape == (8, 10)


def test_feeds_outputs_and_custom_ops_are_named():
    ort = OnnxRuntimeExecutor(mlp(hidden=[8]))
    logits = ort.inference({"input": _batch((1, 28, 28))["input"]}, ["logits"])  # no labels
    assert logits["logits"].shape == (8, 10)
    with pytest.raises(GraphError, match=r"graph inputs \['labels'\] are needed"):
        ort.inference({"input": _batch((1, 28, 28))["input"]})
    with pytest.raises(GraphError, match="graph outputs only"):
        ort.inference(_batch((1, 28, 28)), ["fc0"])
    b = GraphBuilder("custom")
    x = b.input("x", np.float32, ("N", 3))
    b.output(b.node("Swish", [x], name="swish", domain="ai.meta.custom"), np.float32, ("N", 3))
    with pytest.raises(GraphError, match=r"(?s)cannot run 1 node.*'swish' \(Swish\)"):
        OnnxRuntimeExecutor(b.build())


def test_recipe_component():
    component = EXECUTORS["onnxruntime"]
    assert set(component.options) == {"threads", "providers"}
    executor = component.build(mlp(hidden=[4]), threads=1)
    assert isinstance(executor, OnnxRuntimeExecutor) and executor.threads == 1
    with pytest.raises(Exception, match="not available here"):
        component.build(mlp(hidden=[4]), providers=["NoSuchExecutionProvider"])
