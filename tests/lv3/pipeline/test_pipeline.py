"""Pipeline parallelism: partitioning, schedules and their model at size 1; the checks of
``pipeline_checks.py`` in-process and under ``mpiexec -n 2`` and ``-n 4``; the strategy as a
recipe component."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv0 import Context
from meta.lv1 import ReferenceExecutor, mlp
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv1.builder import GraphBuilder
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import STRATEGIES, SingleProcessCommunicator
from meta.lv1.partition import (
    PartitionError,
    balanced_bounds,
    node_costs,
    partition,
)
from meta.lv3.pipeline.schedule import (
    SCHEDULES,
    bubble_estimate,
    gpipe,
    in_flight,
    one_f_one_b,
    schedule,
    simulate,
)
from meta.lv3.pipeline.stage import tape_bytes
from meta.lv3.pipeline.strategy import Pipeline
from meta.run.recipe import AtLeast, RecipeError, load_recipe, make_recipe
from meta.run.runner import RecipeRun

from . import pipeline_checks

SCRIPT = str(Path(pipeline_checks.__file__))
REPO = Path(__file__).resolve().parents[3]


# -- the MPI checks ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(pipeline_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    pipeline_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])  # 4: oversubscribed on the 2-core machine
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    """Gradients of one step, 2 and 4 stages, 1 to 8 micro-batches, both schedules: within
    1e-6 of one process's (float64)."""
    out = mpirun(n, [sys.executable, SCRIPT], timeout=120)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(pipeline_checks.CHECKS)} checks passed" in out, out


# -- balancing ----------------------------------------------------------------------------------

def _brute_force(costs: list[float], stages: int) -> float:
    n = len(costs)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:])))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_balanced_bounds_minimise_the_largest_stage(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = rng.choice([0.0, 1.0, 2.0, 5.0, 7.5], size=int(rng.integers(4, 10))).tolist()
    stages = int(rng.integers(1, min(5, len(costs)) + 1))
    bounds = balanced_bounds(costs, stages)
    assert bounds[0] == 0 and bounds[-1] == len(costs) and len(bounds) == stages + 1
    assert all(b > a for a, b in zip(bounds[:-1], bounds[1:]))  # no empty stage
    largest = max(sum(costs[a:b]) for a, b in zip(bounds[:-1], bounds[1:]))
    assert largest == pytest.approx(_brute_force(costs, stages))


def test_free_nodes_do_not_make_a_stage_of_their_own() -> None:
    # flatten, fc0, relu0, fc1, relu1, logits, loss: the largest stage is fc0 however the
    # free nodes fall; the most even split keeps Flatten with fc0
    assert balanced_bounds([0, 10, 0, 6, 0, 5, 0], 3) == [0, 2, 4, 7]
    with pytest.raises(PartitionError, match="cannot cut 2 nodes into 3"):
        balanced_bounds([1, 1], 3)


def test_parameter_costs_and_flops_of_an_mlp() -> None:
    graph = mlp(input_shape=(1, 4, 4), hidden=[8], classes=3)
    params = node_costs(graph, "params")
    assert params == {"flatten": 0, "fc0": 16 * 8 + 8, "relu0": 0, "logits": 8 * 3 + 3,
                      "loss": 0}
    batch = {"input": np.zeros((5, 1, 4, 4), np.float32), "labels": np.zeros(5, np.int64)}
    flops = node_costs(graph, "flops", ReferenceExecutor, batch)
    assert flops["fc0"] == 2 * 5 * 16 * 8 and flops["logits"] == 2 * 5 * 8 * 3
    assert flops["relu0"] == 5 * 8


def test_measured_costs_time_every_node_and_leave_the_state_alone() -> None:
    b = GraphBuilder("bn")
    x = b.input("input", np.float64, ("N", 3))
    labels = b.input("labels", np.int64, ("N",))
    w = b.initializer("w", np.ones((2, 3)))
    stats = [b.initializer(k, v) for k, v in (("scale", np.ones(2)), ("bias", np.zeros(2)),
                                                ("mean", np.zeros(2)), ("var", np.ones(2)))]
    h = b.node("BatchNormalization", [b.node("Gemm", [x, w], name="fc", transB=1), *stats],
               name="bn", training_mode=1)
    loss = b.node("SoftmaxCrossEntropyLoss", [h, labels], name="loss")
    b.output(h, np.float64, ("N", 2))
    b.output(loss, np.float64, ())
    graph = b.build()
    batch = {"input": np.arange(12.0).reshape(4, 3), "labels": np.array([0, 1, 0, 1])}
    costs = node_costs(graph, "measured", ReferenceExecutor, batch, repeats=2)
    assert set(costs) == {"fc", "bn", "loss"} and all(c > 0 for c in costs.values())
    assert graph.initializers["mean"].tolist() == [0, 0]  # profiling trained nothing


# -- cutting ------------------------------------------------------------------------------------

def test_cuts_at_named_nodes_and_what_crosses_them() -> None:
    graph = pipeline_checks.skip_net()
    part = partition(graph, 3, cuts=["relu0", "relu1"])
    assert [s.nodes for s in part.stages] == [["fc0", "relu0"], ["fc1", "relu1"],
                                              ["fc2", "relu2", "skip", "logits", "loss"]]
    assert [s.sends for s in part.stages] == [["relu0"], ["relu0", "relu1"], []]
    assert [s.receives for s in part.stages] == [[], ["relu0"], ["relu0", "relu1"]]
    assert [s.feeds for s in part.stages] == [["input"], [], ["labels"]]
    assert part.cuts == ["relu0", "relu1"] and part.balance == "cuts"
    assert part.stages[2].initializers == ["fc2.weight", "fc2.bias", "out.weight"]


def test_stage_graphs_share_the_arrays_and_keep_the_roles() -> None:
    graph = mlp(input_shape=(1, 4, 4), hidden=[8, 6], classes=3)
    graph.freeze("fc0.bias")
    part = partition(graph, 3)
    subs = [part.stage_graph(graph, s) for s in range(3)]
    assert [n for s in part.stages for n in s.nodes] == [n.name for n in graph.nodes]
    assert sorted(k for g in subs for k in g.parameters) == sorted(graph.parameters)
    owner = next(g for g in subs if "fc0.bias" in g.initializers)
    assert owner.roles["fc0.bias"] == "frozen"
    assert owner.initializers["fc0.weight"] is graph.initializers["fc0.weight"]
    assert [t.name for t in subs[-1].outputs] == ["logits", "loss"]
    assert len(part.describe(graph).splitlines()) == 3


def test_refused_cuts_name_the_problem() -> None:
    graph = mlp(input_shape=(1, 4, 4), hidden=[8], classes=3)
    with pytest.raises(PartitionError, match="3 stages need 2 cut point"):
        partition(graph, 3, cuts=["fc0"])
    with pytest.raises(PartitionError, match="'fc9' is not a node"):
        partition(graph, 2, cuts=["fc9"])
    with pytest.raises(PartitionError, match="in execution order"):
        partition(graph, 3, cuts=["relu0", "fc0"])
    with pytest.raises(PartitionError, match="2 stages need 1 cut point"):
        partition(graph, 2, cuts=["fc0", "relu0"])


def test_a_weight_read_in_two_stages_is_refused() -> None:
    b = GraphBuilder("tied")
    x = b.input("input", np.float64, ("N", 4))
    labels = b.input("labels", np.int64, ("N",))
    w = b.initializer("w", np.eye(4))
    h = b.node("Relu", [b.node("Gemm", [x, w], name="fc0")], name="relu0")
    logits = b.node("Gemm", [h, w], name="fc1")
    loss = b.node("SoftmaxCrossEntropyLoss", [logits, labels], name="loss")
    b.output(logits, np.float64, ("N", 4))
    b.output(loss, np.float64, ())
    with pytest.raises(PartitionError, match="parameter 'w' is read by nodes of stages"):
        partition(b.build(), 2, cuts=["relu0"])
    assert len(partition(b.build(), 2, cuts=["fc1"]).stages) == 2  # readers kept together


# -- schedules and their model -----------------------------------------------------------------

@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 4), (3, 2), (4, 8), (5, 3)])
def test_schedules_run_every_micro_batch_once_forward_then_back(name: str, p: int, m: int):
    plans = [schedule(name, s, p, m) for s in range(p)]
    for s, ops in enumerate(plans):
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
        assert in_flight(ops) == (m if name == "gpipe" else min(p - s, m))
    model = simulate(plans, [1.0] * p, [2.0] * p)
    assert model.step_s == pytest.approx((m + p - 1) * 3.0)
    assert model.bubble == pytest.approx(bubble_estimate(p, m))
    assert schedule(name, 0, p, m, backward=False) == [("F", i) for i in range(m)]


def test_the_model_adds_messages_and_waits_for_the_slowest_stage() -> None:
    # GPipe pays one activation on the way in and one gradient on the way out; 1F1B's
    # warm-up and steady state wait for the round trip of every exchange
    fill_drain = simulate([gpipe(4)] * 2, [1.0, 1.0], [1.0, 1.0], [0.5], [0.5])
    assert fill_drain.step_s == (4 + 1) * 2 + 2 * 0.5
    plans = [one_f_one_b(s, 2, 4) for s in range(2)]
    assert simulate(plans, [1.0, 1.0], [1.0, 1.0], [0.5], [0.5]).step_s == 12.0
    slow = simulate([gpipe(4)] * 2, [1.0, 3.0], [1.0, 3.0])
    assert slow.step_s == pytest.approx(1 + 4 * 3 + 4 * 3 + 1)  # the slow stage sets the pace
    assert slow.idle[1] < slow.idle[0]
    # two cores for four stages: the filled pipeline runs two operations at a time
    plans = [gpipe(8)] * 4
    assert simulate(plans, [1.0] * 4, [1.0] * 4, cores=4).step_s == (8 + 3) * 2
    shared = simulate(plans, [1.0] * 4, [1.0] * 4, cores=2)
    assert shared.step_s >= 4 * 8 * 2 / 2 and shared.step_s > (8 + 3) * 2
    with pytest.raises(ValueError, match="deadlock"):
        simulate([[("B", 0), ("F", 0)], gpipe(1)], [1, 1], [1, 1])


def test_stored_bytes_count_each_range_once_and_leave_out_the_batch() -> None:
    batch, activation = np.zeros((8, 10)), np.zeros((4, 5))
    ctx = Context()
    ctx.save(x=batch[:4], y=activation, y_flat=activation.reshape(-1), pair=(activation[:2],))
    assert tape_bytes([(None, ctx)], exclude={id(batch)}) == activation.nbytes
    assert tape_bytes([(None, ctx)], exclude=set()) == 4 * 10 * 8 + activation.nbytes
    ctx.save(z=batch[6:])  # a second range of the batch
    assert tape_bytes([(None, ctx)], exclude=set()) == 6 * 10 * 8 + activation.nbytes


# -- the strategy as a component ---------------------------------------------------------------

def test_pipeline_is_a_strategy_a_recipe_can_name() -> None:
    component = STRATEGIES["pipeline"]
    assert component.meta["cls"] is Pipeline
    assert set(component.options) == {"stages", "micro_batches", "schedule", "cuts", "balance"}
    assert component.check({"schedule": "zigzag"}) == [
        "strategy 'pipeline': option 'schedule' must be one of gpipe, 1f1b, got 'zigzag'"]
    assert Pipeline.replica(3, 4, stages=4) == (0, 1)  # every rank takes every batch
    with pytest.raises(ComponentError, match="2 stages run on 2 ranks"):
        Pipeline.replica(0, 4, stages=2)
    recipe = load_recipe(REPO / "recipes" / "mnist_pipeline.py")
    assert recipe.definitions.choices["distributed"].component.name == "pipeline"


SMALL = {"dataset": {"name": "synthetic", "train_examples": 96, "test_examples": 40},
         "model": {"name": "mlp", "hidden": [16, 8]}}


def test_a_recipe_trains_through_the_pipeline_on_one_process(tmp_path: Path) -> None:
    """One stage: the runner, trainer, evaluation, report and export through the strategy."""
    made = make_recipe("pipe", SMALL, {"epochs": 2, "batch_size": 16, "lr": 0.1,
                                       "distributed": {"name": "pipeline", "micro_batches": 3,
                                                       "schedule": "gpipe",
                                                       "balance": "flops"}},
                       {"test_accuracy": AtLeast(0.0)})
    outcome = RecipeRun(made, SingleProcessCommunicator(), output_dir=tmp_path,
                        progress=False).execute()
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    assert outcome.passed and metrics["pipeline_stages"] == 1.0
    assert metrics["micro_batches"] == 3.0 and metrics["bubble_predicted"] == 0.0
    assert metrics["stage0_micro_batches_stored"] == 3.0  # gpipe holds all of them
    classes = metrics["stage0_parameters"] - (784 * 16 + 16 + 16 * 8 + 8)
    assert classes % 9 == 0 and classes > 0  # the logits layer: 8 weights + a bias per class
    assert (tmp_path / "model.onnx").exists()


def test_executors_that_compute_their_own_way_are_refused() -> None:
    class Elsewhere(ReferenceExecutor):  # as the pytorch executor: its own backward
        pass

    graph = mlp(input_shape=(1, 4, 4), hidden=[8], classes=3)
    optimizer = Optimizer(sgd(0.1), graph.parameters)
    workload = SimpleNamespace(executor=Elsewhere(graph))  # what check reads of a Workload
    with pytest.raises(ComponentError, match="reference, native or planned executor, not Elsewhere"):
        Pipeline.check(optimizer, SingleProcessCommunicator(), workload)
    workload.executor = ReferenceExecutor(graph)
    Pipeline.check(optimizer, SingleProcessCommunicator(), workload)
    workload.executor = PlannedExecutor(graph)  # the stage interface: a plan per stage
    Pipeline.check(optimizer, SingleProcessCommunicator(), workload)


def test_a_line_search_optimizer_is_refused_before_training() -> None:
    made = make_recipe("pipe", SMALL, {"optimizer": "lbfgs", "distributed": "pipeline"},
                       {"test_accuracy": AtLeast(0.0)})
    with pytest.raises(RecipeError, match="pipeline' updates each stage with a Level 2"):
        RecipeRun(made, SingleProcessCommunicator(), output_dir=None)
