"""recipes/mnist_model_parallel.py: refused on one process (over its parameter budget),
trained at mpiexec -n 2 with each rank holding half of the neurons; its grouped layers send
one allreduce of the logits per step, fully connected ones two activations more."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, from_onnx
from meta.lv2 import mnist
from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
RECIPE = str(REPO / "recipes" / "mnist_model_parallel.py")
BATCH = 128

pytestmark = [pytest.mark.slow]


def test_one_process_is_refused_with_one_line(tmp_path, mnist_dir):
    output = run_command([META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet"],
                         clean_env(), timeout=120, expect_rc=2)
    errors = [line for line in output.splitlines() if line.startswith("meta: error")]
    assert errors == ["meta: error: model 'grouped_mlp' needs 4.31 MB of parameters, more than "
                      "the budget of 3 MB per rank (distributed.param_budget_mb): partition it "
                      "over 2 ranks with distributed: partitioned (mpiexec -n 2)"], output
    assert "Traceback" not in output and not (tmp_path / "metrics.json").exists()


@pytest.mark.mpi
def test_recipe_trains_partitioned_on_2_ranks(tmp_path, mnist_dir, mpirun):
    output = mpirun(2, [META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet"],
                    timeout=400)
    assert output.count("mnist_model_parallel: PASS") == 1, output
    assert "meta: partitioned over 2 ranks: 1 column-parallel, 1 row-parallel, 2 grouped" \
        in output and "meta: bytes per step" in output and "predicted" in output, output
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["test_accuracy"] >= 0.97, metrics
    # over the 3 MB budget whole, under it on each rank; every value on one rank
    assert metrics["parameter_bytes"] > 3e6 > metrics["rank0_parameter_bytes"], metrics
    assert metrics["rank0_parameter_bytes"] + metrics["rank1_parameter_bytes"] == \
        metrics["parameter_bytes"], metrics
    # one allreduce of the logits' partial sums per step (the last batch is smaller)
    assert BATCH * 10 * 4 * 0.99 < metrics["bytes_sent_per_step"] <= BATCH * 10 * 4, metrics
    assert metrics["step_predicted_ms"] > 0 and metrics["step_measured_ms"] > 0, metrics
    # the export holds both ranks' neurons: it scores what the run reported
    test = mnist("test")
    x, y = test.batch(np.arange(len(test)))
    logits = ReferenceExecutor(from_onnx(tmp_path / "model.onnx")).inference(
        {"input": x}, ["logits"])["logits"]
    assert np.mean(logits.argmax(1) == y) == pytest.approx(metrics["test_accuracy"], abs=1e-4)


@pytest.mark.mpi
def test_fully_connected_layers_send_two_activations_more(tmp_path, mnist_dir, mpirun):
    """groups=1: fc1 row-parallel (its output, forward) and fc2 column-parallel (its input's
    gradient, backward) each allreduce 128 x hidden floats per step (hidden 256 here: the
    dense 1x1 convolutions are slow)."""
    mpirun(2, [META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet", "--no-export",
               "--set", "groups=1", "--set", "hidden=256", "--set", "distributed.param_budget_mb=0",
               "--set", "epochs=1", "--set", "train_samples=1280"], timeout=300,
           expect_rc=None)  # ten steps do not reach the recipe's accuracy
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["bytes_sent_per_step"] == BATCH * (2 * 256 + 10) * 4, metrics
    assert metrics["bytes_per_step_predicted"] == metrics["bytes_sent_per_step"], metrics
    assert metrics["layers_column"] == 2 and metrics["layers_row"] == 2, metrics
