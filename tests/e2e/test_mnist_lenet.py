"""The convolutional main job end to end: LeNet-5 on MNIST reaches its accuracy bound."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from meta.lv1 import ReferenceExecutor, from_onnx
from meta.lv2 import mnist
from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "mnist_lenet.py")
META = str(Path(sys.executable).parent / "meta")

pytestmark = pytest.mark.slow


def test_lenet_recipe_passes_and_its_onnx_export_predicts_the_same(tmp_path, mnist_dir):
    out = run_command([META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet"],
                      clean_env(), timeout=600)
    assert "mnist_lenet: PASS" in out, out
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.988

    x, _ = mnist("test").batch(np.arange(200))  # onnx.reference pools in Python loops
    ours = ReferenceExecutor(from_onnx(tmp_path / "model.onnx")).inference(
        {"input": x}, ["logits"])["logits"]
    theirs = ReferenceEvaluator(onnx.load(str(tmp_path / "model.onnx"))).run(
        None, {"input": x})[0]
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
    assert np.array_equal(theirs.argmax(1), ours.argmax(1))
