"""recipes/mnist_pipeline.py end to end at mpiexec -n 2: it passes, prints and saves the bubble
and the per-stage memory, and rank 0 exports the whole trained network (both stages)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, from_onnx
from meta.lv2 import mnist

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def test_pipeline_recipe_on_2_ranks(tmp_path, mnist_dir, mpirun):
    output = mpirun(2, [META, "run", str(REPO / "recipes" / "mnist_pipeline.py"),
                        "--output-dir", str(tmp_path), "--quiet"], timeout=240)
    assert output.count("mnist_pipeline: PASS") == 1, output
    assert "meta: pipeline of 2 stages" in output and "meta: bubble" in output, output
    assert "(p-1)/(m+p-1) = 20.0%" in output, output  # 2 stages, 4 micro-batches
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["test_accuracy"] >= 0.97, metrics
    assert metrics["bubble_predicted"] == pytest.approx(0.2)
    assert 0.0 < metrics["bubble_measured"] < 1.0 and 0.0 < metrics["bubble_modelled"] < 1.0
    parameters = 784 * 256 + 256 + 256 * 512 + 512 + 512 * 256 + 256 + 256 * 512 + 512 \
        + 512 * 10 + 10
    assert metrics["stage0_parameters"] + metrics["stage1_parameters"] == parameters
    assert metrics["stage0_parameter_bytes"] == 4 * metrics["stage0_parameters"]
    # 1F1B: stage 0 holds 2 micro-batches' activations at most, the last stage 1
    assert (metrics["stage0_micro_batches_stored"], metrics["stage1_micro_batches_stored"]) \
        == (2, 1)
    assert metrics["stage0_activation_peak_bytes"] > 0 < metrics["stage1_activation_peak_bytes"]
    # the export holds both stages' trained weights: it scores what the run reported
    test = mnist("test")
    x, y = test.batch(np.arange(len(test)))
    logits = ReferenceExecutor(from_onnx(tmp_path / "model.onnx")).inference(
        {"input": x}, ["logits"])["logits"]
    assert np.mean(logits.argmax(1) == y) == pytest.approx(metrics["test_accuracy"], abs=1e-4)
