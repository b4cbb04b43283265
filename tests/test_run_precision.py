"""``--set precision=bf16`` reaches evaluation too (issue 42): ``meta run``'s test metrics and
``meta eval``'s are measured by an executor planned in bf16, as training is; a float32
evaluation of a bf16 run would report other numbers than the ones training computed in."""

from __future__ import annotations

import io

import pytest

from meta.lv1.plan.precision import native_bf16
from meta.lv2 import Trainer
from meta.lv3 import SingleProcessCommunicator
from meta.run.evaluate import evaluate
from meta.run.recipe import AtLeast, make_recipe
from meta.run.runner import RecipeRun

FIXED = {"dataset": {"name": "synthetic", "train_examples": 64, "test_examples": 32},
         "hidden": [8], "executor": "planned"}
MUTABLE = {"epochs": 1, "batch_size": 32, "precision": "f32"}


@pytest.fixture
def evaluations(monkeypatch) -> list:
    """Each evaluation's executor, its mode and its placement after the evaluation."""
    if not native_bf16()[0]:
        pytest.skip(f"bf16 is not native here ({native_bf16()[1]}): it runs float32")
    seen = []
    original = Trainer.evaluate

    def spied(self, *args, **kwargs):
        metrics = original(self, *args, **kwargs)
        seen.append((self.executor, self.executor.training, self.executor.placement()))
        return metrics
    monkeypatch.setattr(Trainer, "evaluate", spied)
    return seen


def test_run_and_eval_evaluate_in_the_runs_precision(tmp_path, evaluations):
    recipe = make_recipe("bf16_eval", FIXED, MUTABLE, {"test_accuracy": AtLeast(0.0)}) \
        .with_overrides({"precision": "bf16"})
    run = RecipeRun(recipe, SingleProcessCommunicator(), output_dir=tmp_path, progress=False)
    assert run.execute().passed
    evaluate(recipe, tmp_path, io.StringIO())  # meta eval of the run's model.onnx
    assert len(evaluations) >= 2  # the run's test evaluation(s), then meta eval's
    for executor, training, placement in evaluations:
        assert executor.precision == "bf16" and executor.plan_precision == "bf16"
        assert not training
        products = [w for n, w in placement.items() if w.startswith("onednn")]
        assert products and all(w == "onednn bf16" for w in products), placement
