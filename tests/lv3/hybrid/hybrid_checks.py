"""Hybrid checks written once, run in-process at size 1 and under MPI on every rank:

    mpiexec -n 4 python tests/lv3/hybrid/hybrid_checks.py check_allreduce_...  (2 replicas x 2)
    mpiexec -n 5 python tests/lv3/hybrid/hybrid_checks.py check_downpour_...   (1 server + 2 x 2)

Allreduce: each replica runs its shard of a global batch through its pipeline and stage ``s``
of every replica averages its gradients; the averaged gradients, and the weights after several
steps, must be the whole global batch's on one process (float64, within 1e-6). Downpour: a
recipe trains through the runner on learnable synthetic data, and every rank ends with the
servers' model.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from meta.lv1 import Graph, ReferenceExecutor, mlp
from meta.lv1.plan.executor import PlannedExecutor
from meta.lv2.optimizers import (GradientTransformation, Optimizer, chain, clip_by_global_norm,
                                 sgd)
from meta.lv3 import Communicator
from meta.lv3.hybrid.allreduce import HybridAllreduce
from meta.lv3.hybrid.grid import ReplicaGrid
from meta.lv1.partition import partition
from meta.lv3.pipeline.schedule import SCHEDULES
from meta.lv3.pipeline.stage import PipelineExecutor
from meta.run.recipe import AtLeast, make_recipe
from meta.run.runner import RecipeRun
from tests import checks
from tests.lv3.pipeline.pipeline_checks import _batch, small_mlp

TOLERANCE = 1e-6  # the acceptance bound; float64 lands near 1e-16
ROWS = 6  # per replica


def _stages(comm: Communicator) -> int:
    """2 stages per replica on an even number of ranks, else replicas of one stage."""
    return 2 if comm.size % 2 == 0 else 1


def _hybrid(comm: Communicator, m: int, schedule: str, lr: float = 0.1, momentum: float = 0.0,
            kind: type = ReferenceExecutor, graph: Graph | None = None, clip: float = 0.0
            ) -> tuple[HybridAllreduce, ReplicaGrid]:
    graph = small_mlp() if graph is None else graph
    grid = ReplicaGrid(comm.size, _stages(comm), 0, "hybrid_allreduce")
    part = partition(graph, grid.stages, balance="params")
    pipeline_comm, data_comm = grid.split(comm)
    pipe = PipelineExecutor(graph, part, pipeline_comm, kind, _like(graph, _batch(graph, 3)),
                            m, schedule).train(True)
    strategy = HybridAllreduce(Optimizer(_rule(lr, momentum, clip),
                                         pipe.stage_graph.parameters), pipe, grid, comm,
                               data_comm)
    return strategy, grid


def _rule(lr: float, momentum: float, clip: float = 0.0) -> GradientTransformation:
    """SGD, after a clip by global norm where ``clip`` is set."""
    rule = sgd(lr, momentum=momentum)
    return chain(clip_by_global_norm(clip), rule) if clip else rule


def _like(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` in the dtypes of ``graph``'s inputs (a float32 graph's from float64 data)."""
    dtypes = {t.name: t.dtype for t in graph.inputs}
    return {k: v.astype(dtypes[k]) if dtypes.get(k) is not None else v
            for k, v in feeds.items()}


def _shard(feeds: dict[str, np.ndarray], replica: int) -> dict[str, np.ndarray]:
    return {k: v[replica * ROWS:(replica + 1) * ROWS] for k, v in feeds.items()}


def check_allreduce_gradients_match_the_global_batch(comm: Communicator) -> None:
    """One step, 1 to 4 micro-batches, both schedules: the averaged gradients of every stage
    are the single-process gradients of all replicas' rows together."""
    reference = ReferenceExecutor(small_mlp()).train(True)
    for m, schedule in itertools.product(range(1, 5), SCHEDULES):
        strategy, grid = _hybrid(comm, m, schedule)
        replica = grid.position(comm.rank)[0]
        feeds = _batch(small_mlp(), ROWS * grid.replicas, seed=m)
        _, want = reference.inference_and_backprop(feeds)
        values, grads = strategy.pipe.inference_and_backprop(_shard(feeds, replica))
        strategy.step(grads)
        where = f"rank {comm.rank}: {m} micro-batches, {schedule}"
        averaged = strategy.flat_grads.views
        assert sorted(averaged) == sorted(strategy.pipe.stage_graph.parameters), where
        for p, g in averaged.items():
            np.testing.assert_allclose(g, want[p], rtol=0, atol=TOLERANCE, err_msg=f"{where}: {p}")
        if grid.replicas > 1:  # a shard's gradient alone is not the global batch's
            assert max(np.abs(grads[p] - want[p]).max() for p in grads) > 1e-3, where


def check_planned_allreduce_gradients_match_the_global_batch(comm: Communicator) -> None:
    """The stages on the planned executor (float32, a plan per stage and in-flight
    micro-batch), 4 micro-batches, both schedules: every stage's averaged gradients are the
    single process's within 1e-5."""
    def graph() -> Graph:
        return mlp(input_shape=(1, 4, 4), hidden=(12, 10, 8), classes=5, seed=3)

    reference = ReferenceExecutor(graph()).train(True)
    for schedule in SCHEDULES:
        strategy, grid = _hybrid(comm, 4, schedule, kind=PlannedExecutor, graph=graph())
        replica = grid.position(comm.rank)[0]
        feeds = _like(graph(), _batch(graph(), ROWS * grid.replicas, seed=7))
        _, want = reference.inference_and_backprop(feeds)
        strategy.step(strategy.pipe.inference_and_backprop(_shard(feeds, replica))[1])
        assert all(isinstance(ex, PlannedExecutor) for ex in strategy.pipe.slots)
        for p, g in strategy.flat_grads.views.items():
            np.testing.assert_allclose(g, want[p], rtol=0, atol=1e-5,
                                       err_msg=f"rank {comm.rank}, {schedule} (planned): {p}")


def check_allreduce_steps_match_the_global_batch(comm: Communicator) -> None:
    """Four momentum steps, then (after ``finish``) every rank holds the single-process
    weights of the whole network, and the report carries the per-stage figures; the same
    with a clip by global norm that binds (its norm summed over the stages)."""
    for clip in (0.05, 0.0):
        strategy, grid = _hybrid(comm, 3, "1f1b", lr=0.2, momentum=0.9, clip=clip)
        alone = small_mlp()
        single = Optimizer(_rule(0.2, 0.9, clip), alone.parameters)
        executor = ReferenceExecutor(alone).train(True)
        replica = grid.position(comm.rank)[0]
        for step in range(4):
            feeds = _batch(alone, ROWS * grid.replicas, seed=100 + step)
            strategy.step(strategy.pipe.inference_and_backprop(_shard(feeds, replica))[1])
            single.step(executor.inference_and_backprop(feeds)[1])
        strategy.finish()
        for name, value in alone.parameters.items():
            np.testing.assert_allclose(strategy.pipe.graph.initializers[name], value, rtol=0,
                                       atol=TOLERANCE,
                                       err_msg=f"rank {comm.rank}: {name}, clip {clip}")
    report = strategy.report()
    assert report["replicas"] == grid.replicas and report["pipeline_stages"] == grid.stages
    stage_bytes = strategy.flat_params.nbytes if grid.replicas > 1 else 0
    assert report["allreduce_bytes_per_step"] == stage_bytes, report
    s = grid.position(comm.rank)[1]
    assert report[f"stage{s}_allreduce_bytes_per_step"] == stage_bytes, report
    assert report["bytes_sent_per_step"] == report["activation_bytes_per_step"] + stage_bytes
    assert (report["stage0_activation_bytes_per_step"] > 0) == (grid.stages > 1), report
    assert 0.0 <= report["bubble_measured"] < 1.0 and report[f"stage{s}_parameter_bytes"] > 0
    if comm.is_root:
        text = strategy.report_text()
        assert "hybrid_allreduce: " in text and "allreduce" in text.splitlines()[-1], text


def check_downpour_recipe_trains(comm: Communicator) -> None:
    """1 server + 2 replicas x 2 stages (mpiexec -n 5): a recipe trains through the runner,
    the servers' model is every rank's at the end, and the figures are reported."""
    made = make_recipe(
        "hybrid_downpour_check",
        {"dataset": {"name": "synthetic", "train_examples": 1024, "test_examples": 256,
                     "input_shape": [1, 4, 4]},
         "model": {"name": "mlp", "hidden": [32, 32]}, "optimizer": "adagrad"},
        {"epochs": 3, "batch_size": 32, "lr": 0.05,
         "distributed": {"name": "hybrid_downpour", "stages": 2, "servers": 1,
                         "micro_batches": 2, "balance": "params"}},
        {"test_accuracy": AtLeast(0.8)})
    with tempfile.TemporaryDirectory() as folder:
        run = RecipeRun(made, comm, output_dir=Path(folder), progress=False)
        outcome = run.execute()
    metrics = outcome.metrics
    assert outcome.passed, metrics
    losses = [row["train_loss"] for row in outcome.history]
    assert losses[-1] < 0.5 * losses[0], losses
    graph = run.trainer.executor.graph
    first = {k: comm.bcast_obj(v, root=0) for k, v in graph.parameters.items()}
    for name, value in first.items():
        np.testing.assert_array_equal(graph.initializers[name], value,
                                      err_msg=f"rank {comm.rank}: {name}")
    if not comm.is_root:  # rank 0 (stage 0 of replica 0) reports the run
        return
    assert metrics["replicas"] == 2 and metrics["servers"] == 1, metrics
    for s in (0, 1):
        assert metrics[f"stage{s}_push_bytes_per_step"] > 0, metrics
        assert metrics[f"stage{s}_fetch_bytes_per_step"] >= metrics[
            f"stage{s}_push_bytes_per_step"], metrics
    assert metrics["pushes_applied"] > 0 and "bubble_measured" in metrics, metrics


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_allreduce_gradients_match_the_global_batch,
        check_allreduce_steps_match_the_global_batch,
        check_planned_allreduce_gradients_match_the_global_batch,
        check_downpour_recipe_trains,
    )
}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
