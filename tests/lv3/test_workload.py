"""Strategies are built from what they use (issue 40): the optimizer, the communicator and a
``Workload`` (the run's graph, names, rows, batch size, seed), never the trainer."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv1 import ReferenceExecutor, mlp
from meta.lv2 import ShuffleSampler, Trainer
from meta.lv2.datasets import ArrayDataset
from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import STRATEGIES, SingleProcessCommunicator, Workload, make_strategy
from meta.lv3.sandblaster.rows import TrainingRows

LV3 = Path(__file__).parents[2] / "meta" / "lv3"


def _trainer(transform=None) -> Trainer:
    graph = mlp(input_shape=(1, 4, 4), hidden=[8], classes=3)
    rng = np.random.default_rng(0)
    data = ArrayDataset(rng.normal(size=(20, 1, 4, 4)).astype(np.float32),
                        rng.integers(0, 3, 20))
    return Trainer(ReferenceExecutor(graph), Optimizer(sgd(0.1), graph.parameters), data,
                   ShuffleSampler(20, 8, seed=7), transform=transform)


def test_no_strategy_takes_the_trainer():
    """What the issue greps for: no ``trainer: Any`` and no ``getattr(trainer`` in Level 3, and
    every strategy's recipe context is (optimizer, comm, workload)."""
    found = [f"{p.relative_to(LV3)}:{n}" for p in LV3.rglob("*.py")
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"trainer: Any|getattr\(trainer", line)]
    assert found == []
    assert STRATEGIES.context == ("optimizer", "comm", "workload")


def test_the_workload_of_a_trainer_holds_what_strategies_read():
    trainer = _trainer()
    workload = Workload.of(trainer)
    assert workload.graph is trainer.executor.graph
    assert (workload.batch_size, workload.seed, workload.steps_per_epoch) == (8, 7, 3)
    assert not workload.augmented and Workload.of(_trainer(lambda x, rng: x)).augmented
    sample = workload.sample(5)
    assert sorted(sample) == ["input", "labels"] and len(sample["input"]) == 5
    workload.reshard_evaluation(1, 2)  # a shrunk group re-shards the evaluation
    assert trainer.eval_shard == (1, 2)
    assert type(workload.executor_maker()(trainer.executor.graph)) is ReferenceExecutor
    evaluation = TrainingRows(workload)(np.arange(4))  # Sandblaster's rows, from it
    assert TrainingRows(workload).examples == 20 and np.isfinite(evaluation.loss_sum)


def test_strategies_that_cut_the_graph_refuse_a_bare_optimizer_in_one_line():
    opt = Optimizer(sgd(0.1), {"w": np.zeros(2)})
    for name in ("pipeline", "partitioned", "hybrid_allreduce"):
        with pytest.raises(ComponentError, match=f"'{name}' cuts the run's graph") as err:
            make_strategy(name, opt, SingleProcessCommunicator())
        assert "\n" not in str(err.value)


def test_allreduce_seeds_its_compressor_from_the_workload():
    trainer = _trainer()
    params = trainer.executor.graph.parameters
    strategy = make_strategy("allreduce", Optimizer(sgd(0.1), params),
                             SingleProcessCommunicator(), Workload.of(trainer),
                             compression="qsgd")
    assert strategy.compressor is not None
