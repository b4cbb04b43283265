"""Hybrids of data and pipeline parallelism: the grid, the server layout and the refusals at
size 1; the checks of ``hybrid_checks.py`` in-process, under ``mpiexec -n 4`` (allreduce over
2 pipelined replicas) and ``-n 5`` (Downpour: 1 server + 2 replicas x 2 stages); the
strategies as recipe components."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import STRATEGIES, SingleProcessCommunicator, make_strategy
from meta.lv3.hybrid.allreduce import HybridAllreduce
from meta.lv3.hybrid.downpour import HybridDownpour
from meta.lv3.hybrid.grid import ReplicaGrid
from meta.lv3.hybrid.server import ShardLayout
from meta.run.recipe import AtLeast, RecipeError, load_recipe, make_recipe
from meta.run.runner import RecipeRun

from . import hybrid_checks

SCRIPT = str(Path(hybrid_checks.__file__))
REPO = Path(__file__).resolve().parents[3]
META = str(Path(sys.executable).parent / "meta")
ALLREDUCE_CHECKS = [n for n in hybrid_checks.CHECKS if "allreduce" in n]


# -- the MPI checks ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALLREDUCE_CHECKS)
def test_check_at_size_one(name: str) -> None:
    hybrid_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
def test_allreduce_over_two_pipelines_matches_one_process(mpirun: Callable[..., str]) -> None:
    """2 replicas x 2 stages: one step's averaged gradients, and four steps' weights, are the
    whole global batch's on one process (float64, within 1e-6)."""
    out = mpirun(4, [sys.executable, SCRIPT, *ALLREDUCE_CHECKS], timeout=120)
    for rank in range(4):
        assert f"rank {rank}/4: {len(ALLREDUCE_CHECKS)} checks passed" in out, out


@pytest.mark.mpi
@pytest.mark.slow
def test_downpour_over_two_pipelines_trains(mpirun: Callable[..., str]) -> None:
    out = mpirun(5, [sys.executable, SCRIPT, "check_downpour_recipe_trains"], timeout=180)
    assert "hybrid_downpour_check: PASS" in out, out
    for rank in range(5):
        assert f"rank {rank}/5: 1 checks passed" in out, out


# -- the grid ---------------------------------------------------------------------------------

def test_the_grid_puts_a_replica_on_consecutive_ranks_and_servers_last() -> None:
    grid = ReplicaGrid(7, stages=3, servers=1)
    assert (grid.workers, grid.replicas, grid.server_ranks) == (6, 2, [6])
    assert [grid.position(r) for r in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1),
                                                     (1, 2)]
    assert [grid.rank_of(1, s) for s in range(3)] == [3, 4, 5]
    assert [grid.replica(r) for r in range(7)] == [(0, 2)] * 3 + [(1, 2)] * 3 + [(0, 1)]
    with pytest.raises(ValueError, match="rank 6 is a server"):
        grid.position(6)
    assert ReplicaGrid(1, stages=1).replica(0) == (0, 1)
    assert "2 replicas x 3 stages" in grid.describe() and "1 server (rank 6)" in grid.describe()


@pytest.mark.parametrize("size,stages,servers,message", [
    (3, 2, 0, "3 ranks cannot make replicas of 2 stages each; run with -n 2 or -n 4 "
              "(a multiple of 2 ranks)"),
    (1, 2, 0, "1 rank cannot make replicas of 2 stages each; run with -n 2 "),
    (6, 2, 1, "5 workers (6 ranks - 1 server) cannot make replicas of 2 stages each; run "
              "with -n 5 or -n 7 (1 server + a multiple of 2 ranks)"),
    (4, 4, 2, "2 workers (4 ranks - 2 servers) cannot make replicas of 4 stages each; run "
              "with -n 6 (2 servers + a multiple of 4 ranks)"),
])
def test_bad_combinations_are_refused_naming_the_numbers(size, stages, servers, message):
    with pytest.raises(ComponentError, match="^distributed 'h': " + re.escape(message)):
        ReplicaGrid(size, stages, servers, "h")


# -- the servers' layout ----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(10))
def test_every_value_has_one_server_and_the_routes_match_the_pieces(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shapes = [{f"s{s}.{k}": tuple(int(d) for d in rng.integers(1, 5, rng.integers(1, 3)))
               for k in range(int(rng.integers(1, 4)))} for s in range(int(rng.integers(1, 5)))]
    servers = int(rng.integers(1, 5))
    layout = ShardLayout(shapes, servers, np.float32)
    servers = min(servers, layout.total)
    layout = ShardLayout(shapes, servers, np.float32)
    owner = np.full(layout.total, -1)
    for s, (a, _) in enumerate(layout.stage_bounds):
        for j, lo, hi in layout.route(s):
            assert (owner[a + lo:a + hi] == -1).all()
            owner[a + lo:a + hi] = j
            # the server holds the same values as the stage's piece, at its own offsets
            first = layout.shards[j][0]
            assert (s, a + lo - first, a + hi - first) in layout.pieces(j)
    assert (owner >= 0).all()
    assert sum(len(layout.pieces(j)) for j in range(servers)) == sum(
        len(layout.route(s)) for s in range(len(shapes)))
    arrays = {k: np.zeros(shape, np.float32) for st in shapes for k, shape in st.items()}
    layout.unpack(np.arange(layout.total, dtype=np.float32), arrays)
    assert np.concatenate([a.ravel() for a in layout.parameters(arrays).values()]).tolist() \
        == list(range(layout.total))


# -- the strategies as components -------------------------------------------------------------

def test_the_hybrids_are_strategies_a_recipe_can_name() -> None:
    assert STRATEGIES["hybrid_allreduce"].meta["cls"] is HybridAllreduce
    assert STRATEGIES["hybrid_downpour"].meta["cls"] is HybridDownpour
    assert set(STRATEGIES["hybrid_allreduce"].options) == {
        "stages", "micro_batches", "schedule", "cuts", "balance"}
    assert set(STRATEGIES["hybrid_downpour"].options) == {
        "stages", "servers", "n_fetch", "n_push", "micro_batches", "schedule", "cuts",
        "balance"}
    assert STRATEGIES["hybrid_downpour"].check({"stages": 0}) == [
        "strategy 'hybrid_downpour': option 'stages' must be at least 1, got 0"]
    assert HybridDownpour.replica(3, 5, stages=2, servers=1) == (1, 2)
    assert HybridAllreduce.replica(3, 4, stages=2) == (1, 2)
    recipe = load_recipe(REPO / "recipes" / "mnist_hybrid_downpour.py")
    assert recipe.definitions.choices["distributed"].component.name == "hybrid_downpour"
    with pytest.raises(ComponentError, match="hybrid_allreduce' cuts the run's graph"):
        make_strategy("hybrid_allreduce", Optimizer(sgd(0.1), {"w": np.zeros(2)}),
                      SingleProcessCommunicator())


SMALL = {"dataset": {"name": "synthetic", "train_examples": 96, "test_examples": 40,
                     "input_shape": [1, 4, 4]},
         "model": {"name": "mlp", "hidden": [16, 8]}}


def test_one_replica_of_one_stage_trains_through_the_runner(tmp_path: Path) -> None:
    made = make_recipe("hybrid", SMALL, {"epochs": 2, "batch_size": 16, "lr": 0.1,
                                         "distributed": {"name": "hybrid_allreduce",
                                                         "stages": 1, "micro_batches": 2,
                                                         "balance": "params"}},
                       {"test_accuracy": AtLeast(0.0)})
    outcome = RecipeRun(made, SingleProcessCommunicator(), output_dir=tmp_path,
                        progress=False).execute()
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert outcome.passed and metrics["replicas"] == 1.0 and metrics["pipeline_stages"] == 1.0
    assert metrics["allreduce_bytes_per_step"] == 0.0  # one replica exchanges nothing
    assert metrics["stage0_allreduce_bytes_per_step"] == 0.0
    assert (tmp_path / "model.onnx").exists()


def test_a_bad_combination_is_refused_before_training() -> None:
    made = make_recipe("hybrid", SMALL, {"distributed": {"name": "hybrid_downpour"}},
                       {"test_accuracy": AtLeast(0.0)})
    with pytest.raises(RecipeError, match=r"0 workers \(1 rank - 1 server\) cannot"):
        RecipeRun(made, SingleProcessCommunicator(), output_dir=None)


def test_the_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "hybrid.py"
    recipe.write_text(f"from meta.run.recipe import AtLeast\nFIXED = {SMALL!r}\nMUTABLE = "
                      f"{{'distributed': {{'name': 'hybrid_allreduce', 'stages': 2}}}}\n"
                      f"METRICS = {{'test_accuracy': AtLeast(0.0)}}\n")
    done = subprocess.run([META, "run", str(recipe), "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert "1 rank cannot make replicas of 2 stages each; run with -n 2 " in done.stderr, done
    assert "Traceback" not in done.stderr, done
