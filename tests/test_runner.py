"""Building what a recipe names: optimizers, schedules, events (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv2 import LBFGS, Optimizer
from meta.lv3 import SingleProcessCommunicator
from meta.recipe import AtLeast, RecipeError, make_recipe
from meta.runner import build_trainer, learning_rate, make_optimizer

METRICS = {"test_accuracy": AtLeast(0.5)}


def definitions(**mutable):
    return make_recipe("t", {"dataset": "synthetic", "hidden": [8]}, mutable, METRICS)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rmsprop", "adadelta", "adam", "adamw"])
def test_every_named_optimizer_steps(name):
    d = definitions(optimizer=name, weight_decay=0.01, grad_clip=1.0).definitions
    params = {"w": np.ones(3)}
    opt = make_optimizer(d, params, steps_per_epoch=10)
    assert isinstance(opt, Optimizer)
    opt.step({"w": np.array([1.0, -2.0, 3.0])})
    assert not np.allclose(params["w"], 1.0)


def test_line_search_optimizers_and_their_limits():
    d = definitions(optimizer="lbfgs").definitions
    assert isinstance(make_optimizer(d, {"w": np.ones(2)}, 1), LBFGS)

    class TwoRanks(SingleProcessCommunicator):
        @property
        def size(self) -> int:
            return 2

    with pytest.raises(RecipeError, match="'lbfgs' runs on one process only"):
        build_trainer(definitions(optimizer="lbfgs"), TwoRanks())


def test_schedules_follow_the_definitions():
    d = definitions(lr=1.0, lr_schedule="step", lr_decay_epochs=[1], lr_decay_factor=0.5,
                    warmup_epochs=1).definitions
    lr = learning_rate(d, steps_per_epoch=4)
    assert [lr(s) for s in (0, 3, 4, 8)] == pytest.approx([0.25, 1.0, 0.5, 0.5])
    cosine = learning_rate(definitions(lr=1.0, lr_schedule="cosine", epochs=2).definitions, 5)
    assert cosine(0) == pytest.approx(1.0) and cosine(10) == pytest.approx(0.0)
    assert learning_rate(definitions(lr=0.3).definitions, 5) == 0.3


def test_stopping_events_are_on_every_rank_and_writers_on_rank_0(tmp_path):
    recipe = definitions(early_stopping_patience=2, time_budget_s=60.0, augmentation=["flip"])
    trainer, _ = build_trainer(recipe, SingleProcessCommunicator(), output_dir=tmp_path,
                               checkpoint_every=7)
    names = {type(e).__name__ for e in trainer.events}
    assert {"EarlyStopping", "TimeBudget", "CheckpointEvent", "CSVLog", "PlotMetrics"} <= names
    assert trainer.transform is not None


def test_a_recipe_freezes_parameters_by_pattern():
    recipe = make_recipe("t", {"dataset": "synthetic", "hidden": [8], "frozen": ["fc0.*"],
                               "train_samples": 64}, {}, METRICS)
    trainer, _ = build_trainer(recipe, SingleProcessCommunicator())
    graph = trainer.executor.graph
    assert sorted(graph.frozen) == ["fc0.bias", "fc0.weight"]
    assert set(trainer.optimizer.params) == set(graph.parameters) == {"fc1.bias", "fc1.weight"}
    only = make_recipe("t", {"dataset": "synthetic", "hidden": [8], "trainable": ["fc1.w*"],
                             "train_samples": 64}, {}, METRICS)
    assert list(build_trainer(only, SingleProcessCommunicator())[0].optimizer.params) == [
        "fc1.weight"]
    typo = make_recipe("t", {"dataset": "synthetic", "hidden": [8], "frozen": ["fc9.*"],
                             "train_samples": 64}, {}, METRICS)
    with pytest.raises(RecipeError, match="pattern 'fc9.\\*' matches no initializer"):
        build_trainer(typo, SingleProcessCommunicator())
