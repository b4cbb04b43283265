"""DistBelief-style asynchronous recipes end to end under mpiexec: Downpour SGD and
asynchronous SGD through one-sided MPI windows (1 server + 2 workers each)."""

from __future__ import annotations

import pytest

from tests.e2e.test_strategies import run_recipe

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def test_downpour_recipe_on_3_ranks(tmp_path, mnist_dir, mpirun):
    output, metrics = run_recipe(mpirun, 3, "mnist_downpour", tmp_path)
    assert "downpour step phases on rank 0" in output
    assert "staleness of applied pushes" in output
    counts = {k: v for k, v in metrics.items() if k.startswith("staleness_count_")}
    assert counts and all(v > 0 for v in counts.values()), metrics
    assert sum(counts.values()) == metrics["pushes_applied"]
    assert metrics["pushes_from_worker_0"] > 0 and metrics["pushes_from_worker_1"] > 0


def test_async_rma_recipe_on_3_ranks(tmp_path, mnist_dir, mpirun):
    output, metrics = run_recipe(mpirun, 3, "mnist_async_rma", tmp_path)
    assert "async_rma step phases on rank 0" in output
    assert metrics["bytes_sent_per_step"] > 0


def test_a_warm_start_longer_than_an_epoch_ends_with_the_first_epoch(tmp_path, mnist_dir,
                                                                      mpirun):
    """mnist_downpour's 50 warm-start steps against 16 per epoch (2,048 examples, 2 workers):
    this hung (worker 0 in the epoch's metrics allreduce, the others waiting for its "go")."""
    from tests.e2e.test_strategies import META, REPO

    out = mpirun(3, [META, "run", str(REPO / "recipes" / "mnist_downpour.py"), "--quiet",
                     "--no-export", "--output-dir", str(tmp_path), "--set",
                     "train_samples=2048", "--set", "epochs=2"], expect_rc=None, timeout=120)
    assert out.count("meta: downpour: warm_start_steps=50 is more than worker 0's 16 steps "
                     "per epoch; the other workers start after its first epoch") == 1, out
    assert "mnist_downpour: PASS" in out or "mnist_downpour: FAIL" in out, out
    assert (tmp_path / "metrics.json").is_file()
