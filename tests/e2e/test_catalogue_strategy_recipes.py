"""The hierarchical parameter server, neighbourhood averaging and Hogwild recipes under mpiexec:
each reaches the MNIST MLP's bound and reports what it moved; Hogwild refuses ranks that are
not on one node in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
N_PARAMS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def run_recipe(mpirun, n: int, name: str, out: Path, *sets: str) -> tuple[str, dict]:
    args = [META, "run", str(REPO / "recipes" / f"{name}.py"), "--output-dir", str(out),
            "--quiet", "--no-export", *(f"--set={s}" for s in sets)]
    output = mpirun(n, args, timeout=240)
    assert output.count(f"{name}: PASS") == 1, output
    report = json.loads((out / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.97, report["metrics"]
    return output, report["metrics"]


def test_hierarchical_server_cuts_the_global_bytes_by_the_fan_in(tmp_path, mnist_dir, mpirun):
    """-n 5: 4 workers, fan-in 2 (the recipe) against one level (fan-in 1, a short run)."""
    output, tree = run_recipe(mpirun, 5, "mnist_hierarchical_ps", tmp_path / "tree")
    assert tree["aggregators"] == 2 and tree["fan_in"] == 2
    assert tree["global_server_bytes_per_step"] == 2 * 4 * N_PARAMS, tree
    assert "received 1881168 bytes per step from 2 aggregator(s) of fan-in 2" in output, output
    flat_run = tmp_path / "flat"
    mpirun(5, [META, "run", str(REPO / "recipes" / "mnist_hierarchical_ps.py"), "--output-dir",
               str(flat_run), "--quiet", "--no-export", "--set=fan_in=1", "--set=epochs=1",
               "--set=train_samples=4000"], timeout=240, expect_rc=None)
    flat = json.loads((flat_run / "metrics.json").read_text())["metrics"]
    assert flat["aggregators"] == 4
    assert flat["global_server_bytes_per_step"] / tree["global_server_bytes_per_step"] == 2.0


def test_neighbour_averaging_on_a_ring_of_4(tmp_path, mnist_dir, mpirun):
    output, metrics = run_recipe(mpirun, 4, "mnist_neighbours", tmp_path)
    assert metrics["neighbours"] == 2.0  # a 1-D periodic grid of 4
    # two full parameter messages a step, plus the final allreduce spread over the steps
    assert 2 * 4 * N_PARAMS <= metrics["bytes_sent_per_step"] < 2.01 * 4 * N_PARAMS, metrics
    assert 0.0 < metrics["replica_spread"] < 0.05, metrics
    assert "neighbours step phases on rank 0" in output


def test_hogwild_on_one_node(tmp_path, mnist_dir, mpirun):
    _, metrics = run_recipe(mpirun, 2, "mnist_hogwild", tmp_path)
    assert metrics["bytes_sent_per_step"] == 0.0
    assert metrics["shared_bytes_written_per_step"] == 4 * N_PARAMS


def test_hogwild_refuses_ranks_on_several_nodes(tmp_path, mnist_dir, mpirun):
    """A launcher that puts 1 of the 2 ranks on this node (MPI_LOCALNRANKS, as Hydra says)."""
    output = mpirun(2, ["env", "MPI_LOCALNRANKS=1", META, "run",
                        str(REPO / "recipes" / "mnist_hogwild.py"), "--output-dir",
                        str(tmp_path), "--quiet"], expect_rc=2, timeout=120)
    lines = [line for line in output.splitlines() if line.startswith("meta: error")]
    assert lines == ["meta: error: recipe 'mnist_hogwild': distributed 'hogwild' shares the "
                     "parameters in one node's memory, but only 1 of the 2 ranks run on this "
                     "node; start all ranks on one node or use distributed 'async_rma' "
                     "(one-sided, across nodes)"], output
    assert "Traceback" not in output
