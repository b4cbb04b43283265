"""recipes/mnist_sandblaster.py: Sandblaster L-BFGS under mpiexec -n 3, and plain L-BFGS on one
process (the same recipe, no workers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
RECIPE = str(REPO / "recipes" / "mnist_sandblaster.py")

pytestmark = [pytest.mark.slow]


@pytest.mark.mpi
def test_recipe_passes_under_mpiexec(tmp_path, mnist_dir, mpirun):
    output = mpirun(3, [META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet",
                        "--no-export"], timeout=600)
    assert output.count("mnist_sandblaster: PASS") == 1, output
    assert "sandblaster portions per worker" in output, output
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert metrics["test_accuracy"] >= 0.9 and metrics["iterations"] == 40, metrics
    assert metrics["portions_worker_0"] > 0 and metrics["portions_worker_1"] > 0, metrics
    # Every evaluation's 8 portions counted once, whoever's copy won.
    assert metrics["portions_worker_0"] + metrics["portions_worker_1"] == \
        8 * metrics["evaluations"], metrics


def test_one_process_runs_plain_lbfgs(tmp_path, mnist_dir):
    output = run_command([META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet",
                          "--no-export", "--set", "epochs=3"], clean_env(), timeout=300,
                         expect_rc=None)  # 3 iterations do not reach the recipe's accuracy
    assert "running recipe mnist_sandblaster\n" in output, output
    history = json.loads((tmp_path / "metrics.json").read_text())["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"], history
