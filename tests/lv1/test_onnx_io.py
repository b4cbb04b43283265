from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from meta.lv1 import ONNXLoadError, ReferenceExecutor, from_onnx, mlp, save_onnx, to_onnx
from meta.lv2 import Optimizer, sgd


def test_round_trip_keeps_structure_and_outputs():
    graph = mlp(hidden=[32, 16], seed=3)
    back = from_onnx(to_onnx(graph))
    assert [n.op_type for n in back.nodes] == [n.op_type for n in graph.nodes]
    assert back.opset == graph.opset and set(back.parameters) == set(graph.parameters)
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    y = np.array([1, 2, 3, 4])
    a = ReferenceExecutor(graph).inference({"input": x, "labels": y})
    b = ReferenceExecutor(back).inference({"input": x, "labels": y})
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_trained_export_predicts_like_the_framework(tmp_path):
    graph = mlp(hidden=[64], seed=0)
    ex = ReferenceExecutor(graph)
    opt = Optimizer(sgd(0.1, 0.9), graph.parameters)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    for _ in range(5):
        opt.step(ex.inference_and_backprop({"input": x, "labels": y})[1])
    path = save_onnx(graph, tmp_path / "m.onnx", outputs=["logits"])
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["input"]  # no labels in an inference model
    theirs = ReferenceEvaluator(model).run(None, {"input": x})[0]
    ours = ex.inference({"input": x}, ["logits"])["logits"]
    np.testing.assert_allclose(theirs, ours, rtol=1e-5, atol=1e-5)
    assert (theirs.argmax(1) == ours.argmax(1)).all()


def test_unknown_export_output_is_named():
    with pytest.raises(ValueError, match="'probs'"):
        to_onnx(mlp(hidden=[4]), outputs=["probs"])


def test_bad_files_give_clear_errors(tmp_path):
    with pytest.raises(ONNXLoadError, match="no such ONNX file"):
        from_onnx(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07\xff\xff\xff not a model")
    with pytest.raises(ONNXLoadError, match="junk.onnx: not a readable ONNX model"):
        from_onnx(junk)
    good = save_onnx(mlp(hidden=[4]), tmp_path / "good.onnx")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ONNXLoadError, match="truncated.onnx"):
        from_onnx(truncated)
