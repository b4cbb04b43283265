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
