"""Building what a recipe names: optimizers, schedules, events, freezing (no training here)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv2 import LBFGS, OPTIMIZERS, Optimizer, build_optimizer
from meta.lv2.optimizers import learning_rate
from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import AtLeast, RecipeError, make_recipe
from meta.run.runner import RecipeRun

METRICS = {"test_accuracy": AtLeast(0.5)}
SMALL = {"dataset": {"name": "synthetic", "train_examples": 64, "test_examples": 32},
         "hidden": [8]}


def recipe(**mutable):
    return make_recipe("t", SMALL, mutable, METRICS)


def build(made, tmp_path=None, **options):
    return RecipeRun(made, SingleProcessCommunicator(), output_dir=tmp_path, **options).trainer


@pytest.mark.parametrize("name", ["sgd", "adagrad", "rmsprop", "adadelta", "adam", "adamw"])
def test_every_named_optimizer_steps(name):
    params = {"w": np.ones(3)}
    opt = build_optimizer(OPTIMIZERS[name], {"weight_decay": 0.01, "grad_clip": 1.0}, params,
                          steps_per_epoch=10, epochs=1)
    assert isinstance(opt, Optimizer)
    opt.step({"w": np.array([1.0, -2.0, 3.0])})
    assert not np.allclose(params["w"], 1.0)


def test_line_search_optimizers_and_their_limits():
    assert isinstance(build_optimizer(OPTIMIZERS["lbfgs"], {}, {"w": np.ones(2)}, 1, 1), LBFGS)
    assert "lr" not in OPTIMIZERS["lbfgs"].options  # no learning rate to set, so none offered

    class TwoRanks(SingleProcessCommunicator):
        @property
        def size(self) -> int:
            return 2

    with pytest.raises(RecipeError, match="cannot run a line-search optimizer on 2 ranks"):
        RecipeRun(recipe(optimizer="lbfgs"), TwoRanks(), output_dir=None)


def test_schedules_follow_the_options():
    common = OPTIMIZERS["sgd"].resolve({"lr": 1.0, "lr_schedule": "step", "lr_decay_epochs": [1],
                                        "lr_decay_factor": 0.5, "warmup_epochs": 1})
    lr = learning_rate(common, steps_per_epoch=4, epochs=2)
    assert [lr(s) for s in (0, 3, 4, 8)] == pytest.approx([0.25, 1.0, 0.5, 0.5])
    cosine = learning_rate(OPTIMIZERS["sgd"].resolve({"lr": 1.0, "lr_schedule": "cosine"}), 5, 2)
    assert cosine(0) == pytest.approx(1.0) and cosine(10) == pytest.approx(0.0)
    assert learning_rate(OPTIMIZERS["sgd"].resolve({"lr": 0.3}), 5, 1) == 0.3


def test_stopping_events_are_on_every_rank_and_writers_on_rank_0(tmp_path):
    made = make_recipe("t", {**SMALL, "augmentation": ["flip"],
                             "events": [{"name": "early_stopping", "patience": 2},
                                        {"name": "time_budget", "seconds": 60.0}]}, {}, METRICS)
    trainer = build(made, tmp_path, checkpoint_every=7)
    names = {type(e).__name__ for e in trainer.events}
    assert {"EarlyStopping", "TimeBudget", "CheckpointEvent", "CSVLog", "PlotMetrics"} <= names
    assert trainer.transform is not None


def test_a_recipe_freezes_parameters_by_pattern():
    made = make_recipe("t", {**SMALL, "frozen": ["fc0.*"]}, {}, METRICS)
    trainer = build(made)
    graph = trainer.executor.graph
    assert sorted(graph.frozen) == ["fc0.bias", "fc0.weight"]
    assert set(trainer.optimizer.params) == set(graph.parameters) == {"fc1.bias", "fc1.weight"}
    only = make_recipe("t", {**SMALL, "model": {"name": "mlp", "trainable": ["fc1.w*"]}}, {},
                       METRICS)
    assert list(build(only).optimizer.params) == ["fc1.weight"]
    typo = make_recipe("t", {**SMALL, "frozen": ["fc9.*"]}, {}, METRICS)
    with pytest.raises(RecipeError, match="pattern 'fc9.\\*' matches no initializer"):
        build(typo)


def test_the_trainer_names_follow_the_graph():
    trainer = build(recipe())
    assert trainer.names["input"] == "input" and trainer.names["logits"] == "logits"


def test_the_runner_stays_composition():
    """meta/run/runner.py composes (issue 40: at most 250 lines); what it builds, components
    and the small modules of meta.run build (data_and_model, writer_events, resume,
    recipe_metrics, nothing_learned, stop_on_signal)."""
    from pathlib import Path

    import meta.run.runner as runner

    lines = Path(runner.__file__).read_text().count("\n")
    assert lines <= 250, f"meta/run/runner.py has {lines} lines"
