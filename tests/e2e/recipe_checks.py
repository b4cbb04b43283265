"""Shared end-to-end check: a shipped recipe passes, and its ONNX export predicts like meta."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from meta.lv1 import ReferenceExecutor, from_onnx
from meta.lv2 import ArrayDataset
from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")


def recipe_path(name: str) -> str:
    return str(REPO / "recipes" / f"{name}.py")


def run_shipped_recipe(name: str, out: Path, timeout: float = 600) -> dict:
    """Run ``recipes/<name>.py`` as a user would; returns its metrics.json report."""
    printed = run_command([META, "run", recipe_path(name), "--output-dir", str(out), "--quiet"],
                          clean_env(), timeout=timeout)
    assert f"{name}: PASS" in printed, printed
    return json.loads((out / "metrics.json").read_text())


def assert_export_predicts_like_meta(out: Path, test: ArrayDataset, images: int) -> None:
    """``out/model.onnx`` through onnx.reference gives meta's logits and predictions."""
    x, _ = test.batch(np.arange(images))
    ours = ReferenceExecutor(from_onnx(out / "model.onnx")).inference(
        {"input": x}, ["logits"])["logits"]
    theirs = ReferenceEvaluator(onnx.load(str(out / "model.onnx"))).run(None, {"input": x})[0]
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4)
    assert np.array_equal(theirs.argmax(1), ours.argmax(1))
