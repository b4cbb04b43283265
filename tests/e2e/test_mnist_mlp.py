"""The main job end to end under mpiexec -n 2 (one process: test_wheel_install.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "mnist_mlp.py")
META = str(Path(sys.executable).parent / "meta")
# Appended to the shipped recipe: its MUTABLE definitions plus a shorter training set.
SHORT = '\nMUTABLE = {**MUTABLE, "train_samples": 12900}\n'

pytestmark = pytest.mark.slow


# The single-process main job runs as a user who installed the wheel runs it, by name from an
# empty folder, and its ONNX export is checked there: tests/e2e/test_wheel_install.py.


@pytest.mark.mpi
def test_recipe_passes_under_mpiexec_printing_from_rank_0_only(tmp_path, mnist_dir, mpirun):
    out = mpirun(2, [META, "run", RECIPE, "--output-dir", str(tmp_path), "--quiet"],
                 timeout=300)
    assert out.count("mnist_mlp: PASS") == 1, out
    assert out.count("running recipe mnist_mlp on 2 ranks") == 1
    assert out.count("epoch  train loss") == 1
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.975


@pytest.mark.mpi
def test_both_ranks_end_with_identical_weights(mnist_dir, mpirun, tmp_path):
    """The main job's recipe as shipped but for its length: one epoch of the first 12,900
    examples (each rank 50 batches of 128, then a smaller last one, which has a plan of its
    own), not the full epoch of 60,000: whether the replicas stay identical is settled by the
    steps' exchange, not by how many of them there are."""
    recipe = tmp_path / "mnist_mlp.py"
    recipe.write_text(Path(RECIPE).read_text() + SHORT)
    script = str(REPO / "tests" / "e2e" / "rank_weights.py")
    out = mpirun(2, [sys.executable, script, str(recipe), "epochs=1"],
                 timeout=300)
    assert "ranks=2" in out and "replicas identical" in out, out


@pytest.mark.mpi
def test_an_input_error_on_one_rank_stops_every_rank(tmp_path, mnist_dir, mpirun):
    recipe = tmp_path / "rank1_only.py"
    recipe.write_text(
        "import os\n"
        "from meta.run.recipe import AtLeast\n"
        "FIXED = {'lrr': 0.1} if os.environ.get('PMI_RANK') == '1' else {}\n"
        "MUTABLE = {'epochs': 1}\n"
        "METRICS = {'test_accuracy': AtLeast(0.5)}\n")
    out = mpirun(2, [META, "run", str(recipe), "--quiet"], expect_rc=2, timeout=60)
    assert "meta: error (on rank 1): recipe 'rank1_only'" in out
    assert "did you mean 'lr'" in out and "running recipe" not in out
