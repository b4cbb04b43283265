"""Partitioned layers: the plan (which layers split how, shards, collectives), the budget's
refusal, the strategy as a recipe component; the checks of ``partitioned_checks.py``
in-process and under ``mpiexec -n 2`` and ``-n 4``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv1 import mlp
from meta.lv3 import STRATEGIES, Partitioned, SingleProcessCommunicator
from meta.lv3.tensor_parallel.plan import plan, probe
from meta.lv3.tensor_parallel.strategy import check_budget
from meta.run.recipe import AtLeast, load_recipe, make_recipe
from meta.run.runner import RecipeRun

from . import partitioned_checks
from .partitioned_checks import batch, small_cnn, small_mlp

SCRIPT = str(Path(partitioned_checks.__file__))
REPO = Path(__file__).resolve().parents[3]


# -- the MPI checks ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(partitioned_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    partitioned_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])  # 4: oversubscribed on the 2-core machine
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    """Gradients of one partitioned step within 1e-6 of one process's (float64), reference
    and native executors, fully connected and convolutional layers, grouped ones."""
    out = mpirun(n, [sys.executable, SCRIPT], timeout=120)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(partitioned_checks.CHECKS)} checks passed" in out, out


# -- the plan ---------------------------------------------------------------------------------

def _plans(graph, ranks: int):
    shapes = probe(graph, batch(graph, 2))
    return [plan(graph, shapes, r, ranks) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 3, 4])
@pytest.mark.parametrize("make", [small_mlp, small_cnn, lambda: small_cnn(groups=4)])
def test_every_value_is_held_once_and_the_shards_rebuild_the_whole(make, ranks: int) -> None:
    graph = make()
    plans = _plans(graph, ranks)
    for name, whole in graph.parameters.items():
        shards = plans[0].shards[name]
        for other in plans[1:]:  # every rank derives every rank's shards alike
            assert [(s.axis, s.owner, s.indices.tolist()) for s in other.shards[name]] == \
                [(s.axis, s.owner, s.indices.tolist()) for s in shards], name
        held = [s for r, s in enumerate(shards) if s.held_by(r)]
        if not shards[0].split:  # replicated: on every rank
            assert len(held) == ranks
            continue
        rebuilt = np.full_like(whole, np.nan)
        for shard in held:
            shard.put(rebuilt, shard.take(whole))
        np.testing.assert_array_equal(rebuilt, whole, err_msg=name)
        if shards[0].owner is None:
            assert sum(np.prod(s.shape(whole.shape)) for s in held) == whole.size, name


def test_a_layer_without_a_partner_stays_whole_and_one_rank_splits_nothing() -> None:
    graph = mlp(input_shape=(5,), hidden=(6,), classes=3, dtype=np.float64)
    (alone,) = _plans(graph, 1)
    assert {layer.kind for layer in alone.layers.values()} == {"replicated"}
    assert alone.collectives == [] and alone.nodes == graph.nodes
    first, _ = _plans(graph, 2)  # fc0 column, logits row: its allreduce forward only
    assert [first.layers[n].kind for n in ("fc0", "logits")] == ["column", "row"]
    assert [(c.tensor, c.phase) for c in first.collectives] == [("logits", "forward")]
    assert first.step_bytes(10) == 10 * 3 * 8 and first.step_bytes(10, training=False) == 240
    # a layer narrower than the ranks is not split
    assert _plans(graph, 8)[0].layers["fc0"].kind == "replicated"


def test_grouped_layers_with_groups_not_on_the_ranks_are_not_split() -> None:
    three = _plans(small_cnn(groups=4), 3)[0]  # 4 groups on 3 ranks: no local chain
    assert three.layers["conv2"].kind == "replicated" and three.layers["conv1"].kind \
        == "replicated"
    assert [three.layers[n].kind for n in ("fc", "logits")] == ["column", "row"]


# -- the budget -------------------------------------------------------------------------------

def test_a_model_over_the_budget_is_refused_naming_the_ranks_it_needs() -> None:
    graph = mlp(input_shape=(1, 8, 8), hidden=(256, 256), classes=10)  # 0.34 MB
    shapes = probe(graph, {"input": np.zeros((2, 1, 8, 8), np.float32),
                           "labels": np.zeros(2, np.int64)})
    check_budget(graph, shapes, 1, 0.0)  # no limit
    check_budget(graph, shapes, 2, 0.2)  # fits on 2
    with pytest.raises(ComponentError) as err:
        check_budget(graph, shapes, 1, 0.2)
    message = str(err.value)
    assert "\n" not in message
    assert "needs 0.34 MB of parameters, more than the budget of 0.2 MB per rank " \
        "(distributed.param_budget_mb): partition it over 2 ranks with distributed: " \
        "partitioned (mpiexec -n 2)" in message, message
    with pytest.raises(ComponentError, match="on rank 0 of 2 .* partition it over 3 ranks"):
        check_budget(graph, shapes, 2, 0.13)
    with pytest.raises(ComponentError, match="replicated layers alone exceed it"):
        check_budget(graph, shapes, 2, 0.0001)


SMALL = {"dataset": {"name": "synthetic", "train_examples": 96, "test_examples": 40},
         "model": {"name": "mlp", "hidden": [64, 32]}}


def test_a_recipe_over_the_budget_stops_before_training(tmp_path: Path) -> None:
    made = make_recipe("tp", SMALL, {"epochs": 1, "batch_size": 16, "distributed": {
        "name": "partitioned", "param_budget_mb": 0.1}}, {"test_accuracy": AtLeast(0.0)})
    run = RecipeRun(made, SingleProcessCommunicator(), output_dir=tmp_path, progress=False)
    with pytest.raises(ComponentError, match="partition it over 3 ranks"):
        run.execute()
    assert not (tmp_path / "metrics.json").exists()


def test_a_recipe_trains_partitioned_on_one_process(tmp_path: Path) -> None:
    made = make_recipe("tp", SMALL, {"epochs": 2, "batch_size": 16, "lr": 0.1,
                                     "distributed": {"name": "partitioned",
                                                     "param_budget_mb": 1.0}},
                       {"test_accuracy": AtLeast(0.0)})
    outcome = RecipeRun(made, SingleProcessCommunicator(), output_dir=tmp_path,
                        progress=False).execute()
    assert outcome.passed and (tmp_path / "model.onnx").exists()


# -- the strategy as a component --------------------------------------------------------------

def test_partitioned_is_a_strategy_a_recipe_can_name() -> None:
    component = STRATEGIES["partitioned"]
    assert component.meta["cls"] is Partitioned
    assert set(component.options) == {"param_budget_mb", "sequence_parallel"}
    assert component.check({"param_budget_mb": -1.0}) != []
    assert Partitioned.replica(1, 2) == (0, 1)  # every rank takes every batch
    recipe = load_recipe(REPO / "recipes" / "mnist_model_parallel.py")
    assert recipe.definitions.choices["distributed"].component.name == "partitioned"
