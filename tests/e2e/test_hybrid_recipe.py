"""recipes/mnist_hybrid_downpour.py end to end at mpiexec -n 5 (1 server + 2 replicas x 2
stages): it passes, prints and saves per stage the bytes per step, the bubble and the memory,
and rank 0 exports the servers' whole trained model."""

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


def test_hybrid_downpour_recipe_on_5_ranks(tmp_path, mnist_dir, mpirun):
    output = mpirun(5, [META, "run", str(REPO / "recipes" / "mnist_hybrid_downpour.py"),
                        "--output-dir", str(tmp_path), "--quiet"], timeout=300)
    assert output.count("mnist_hybrid_downpour: PASS") == 1, output
    assert "meta: pipeline of 2 stages" in output and "meta: bubble" in output, output
    assert "2 replicas x 2 stages" in output and "1 server (rank 4)" in output, output
    assert "meta: staleness of applied pushes" in output, output
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["test_accuracy"] >= 0.97, metrics
    assert (metrics["replicas"], metrics["servers"], metrics["pipeline_stages"]) == (2, 1, 2)
    assert metrics["bubble_predicted"] == pytest.approx(1 / 3)  # 2 stages, 2 micro-batches
    assert 0.0 < metrics["bubble_measured"] < 1.0, metrics
    parameters = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    assert metrics["stage0_parameters"] + metrics["stage1_parameters"] == parameters
    assert metrics["server0_parameter_bytes"] == 4 * parameters
    for s in (0, 1):
        stage_bytes = 4 * metrics[f"stage{s}_parameters"]
        assert metrics[f"stage{s}_parameter_bytes"] == stage_bytes
        # every step pushes the stage's own gradients, and fetches its own parameters
        # (n_push = n_fetch = 1; the fetch once more at step 0): never the other stage's
        assert metrics[f"stage{s}_push_bytes_per_step"] == pytest.approx(stage_bytes)
        assert stage_bytes < metrics[f"stage{s}_fetch_bytes_per_step"] < 1.01 * stage_bytes
        # 32 examples x 256 or 128 floats forward, their gradients back
        assert metrics[f"stage{s}_activation_bytes_per_step"] > 0
    assert metrics["bytes_sent_per_step"] == pytest.approx(
        metrics["stage0_activation_bytes_per_step"] + metrics["stage0_push_bytes_per_step"])
    assert metrics["stage1_activation_peak_bytes"] > 0  # the last stage keeps the softmax
    assert metrics["pushes_applied"] > 0 and metrics["staleness_mean"] >= 0
    # the export holds both stages of the servers' model: it scores what the run reported
    test = mnist("test")
    x, y = test.batch(np.arange(len(test)))
    logits = ReferenceExecutor(from_onnx(tmp_path / "model.onnx")).inference(
        {"input": x}, ["logits"])["logits"]
    assert np.mean(logits.argmax(1) == y) == pytest.approx(metrics["test_accuracy"], abs=1e-4)
