"""Batch growth (Smith et al.): the schedule, the sharded sampler it resizes, its options as
recipes set them, and the ranks in step under ``mpiexec -n 2``."""

from __future__ import annotations

import sys
from typing import Callable

import pytest

from meta.common.component import ComponentError
from meta.lv2 import EVENTS, ShuffleSampler
from meta.lv2.batch_schedule import BatchGrowth
from meta.lv3 import DistributedSampler, SingleProcessCommunicator
from meta.run.recipe import AtLeast, RecipeError, make_recipe
from tests.lv3.data_parallel import quantize_batch_checks as checks


class Run:
    """The part of a trainer the event touches."""

    def __init__(self, sampler: ShuffleSampler) -> None:
        self.sampler, self.step = sampler, 0


def epochs_seen(growth: BatchGrowth, run: Run, epochs: int) -> list[tuple[int, int, int]]:
    """(batch size, batches, examples) of each epoch, as the trainer would see them."""
    growth.on_train_begin(run)
    seen = []
    for epoch in range(epochs):
        growth.on_epoch_begin(run, epoch)
        run.sampler.set_epoch(epoch)
        batches = list(run.sampler)
        seen.append((run.sampler.batch_size, len(batches), sum(len(b) for b in batches)))
        assert len(batches) == len(run.sampler)
    return seen


def test_batch_grows_where_a_step_schedule_would_decay_the_learning_rate() -> None:
    """Boundaries count like ``lr_decay_epochs``: epoch e (1-based) is the last of a size."""
    seen = epochs_seen(BatchGrowth(epochs=[3, 1], factor=3), Run(ShuffleSampler(900, 10)), 5)
    assert seen == [(10, 90, 900), (30, 30, 900), (30, 30, 900), (90, 10, 900), (90, 10, 900)]


def test_every_rank_grows_alike_and_takes_as_many_steps() -> None:
    """Sharded over 3 ranks (1000 examples: padded to 334 each), every rank's batch grows by
    the factor, so the global batch does too and every rank has the same batches per epoch."""
    per_rank = []
    for rank in range(3):
        run = Run(DistributedSampler(1000, 8, rank=rank, size=3, seed=1))
        per_rank.append(epochs_seen(BatchGrowth(epochs=[1, 2], factor=5), run, 3))
    assert per_rank[0] == [(8, 42, 334), (40, 9, 334), (200, 2, 334)]
    assert per_rank[1] == per_rank[0] == per_rank[2]


def test_factor_one_keeps_the_batch_and_a_rerun_starts_from_the_recipes_batch() -> None:
    run = Run(ShuffleSampler(100, 10))
    assert epochs_seen(BatchGrowth(epochs=[1], factor=1), run, 2) == [(10, 10, 100)] * 2
    growth = BatchGrowth(epochs=[1], factor=2)
    epochs_seen(growth, run, 2)
    assert epochs_seen(growth, run, 2) == [(10, 10, 100), (20, 5, 100)]  # base kept: 10


def test_epoch_metrics_report_the_batch_and_the_steps() -> None:
    run, metrics = Run(ShuffleSampler(100, 10)), {}
    growth = BatchGrowth(epochs=[1], factor=2)
    growth.on_train_begin(run)
    growth.on_epoch_begin(run, 1)
    run.step = 17
    growth.on_epoch_end(run, metrics)
    assert metrics == {"batch_size": 20, "steps": 17}
    assert growth.priority > 0  # before the progress bar reads the epoch's steps


def test_options_are_checked_before_training() -> None:
    component = EVENTS["batch_growth"]
    assert component.check({"epochs": [2], "factor": 0.5}) == [
        "event 'batch_growth': option 'factor' must be at least 1, got 0.5"]
    assert "option 'epochs' is required" in component.check({})[0]
    assert "must be at least 1, got 0" in component.check({"epochs": [0]})[0]
    assert component.check({"epochs": []}) == [
        "event 'batch_growth': option 'epochs' lists no epoch (the epochs after which the "
        "batch grows)"]
    with pytest.raises(ComponentError, match="lists no epoch"):
        BatchGrowth(epochs=[])
    with pytest.raises(RecipeError, match="option 'factor' must be at least 1"):
        make_recipe("r", {"events": [{"name": "batch_growth", "epochs": [1], "factor": 0}]},
                    {}, {"test_accuracy": AtLeast(0.5)})


def test_set_reaches_the_options_of_a_mutable_event() -> None:
    """``--set events.batch_growth.factor=1`` (what ``meta compare --variant`` uses)."""
    recipe = make_recipe("r", {}, {"events": [{"name": "batch_growth", "epochs": [2]},
                                              "early_stopping"]},
                         {"test_accuracy": AtLeast(0.5)})
    changed = recipe.with_overrides({"events.batch_growth.factor": "1",
                                     "events.batch_growth.epochs": "2,3",
                                     "events.early_stopping.patience": "5"})
    events = changed.definitions.as_dict()["events"]
    assert events[0] == {"name": "batch_growth", "epochs": (2, 3), "factor": 1.0}
    assert events[1]["patience"] == 5
    with pytest.raises(RecipeError, match="must be at least 1, got 0.5"):
        recipe.with_overrides({"events.batch_growth.factor": "0.5"})
    with pytest.raises(RecipeError, match="no chosen event 'time_budget'"):
        recipe.with_overrides({"events.time_budget.seconds": "5"})


def test_ranks_in_step_on_one_process() -> None:
    checks.check_batch_growth_keeps_ranks_in_step(SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
def test_ranks_in_step_under_mpiexec(mpirun: Callable[..., str]) -> None:
    out = mpirun(2, [sys.executable, checks.__file__, "batch_growth_keeps_ranks_in_step"],
                 timeout=120)
    for rank in range(2):
        assert f"rank {rank}/2: 1 checks passed" in out, out
