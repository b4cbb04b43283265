"""``--set precision=bf16`` reaches evaluation too (issue 42): ``meta run``'s test metrics, and
``meta eval``'s of the run's folder, are measured by an executor planned in bf16, as training
is; a float32 evaluation of a bf16 run would report other numbers than the run did."""

from __future__ import annotations

import pytest

from meta.lv1.plan.precision import native_bf16
from meta.lv2 import Trainer

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


RECIPE = f"""
from meta.recipe import AtLeast
FIXED = {FIXED!r}
MUTABLE = {MUTABLE!r}
METRICS = {{"test_accuracy": AtLeast(0.0)}}
"""


def test_run_and_eval_evaluate_in_the_runs_precision(tmp_path, evaluations, capsys):
    from meta.cli import main

    recipe, run = tmp_path / "bf16_eval.py", tmp_path / "run"
    recipe.write_text(RECIPE)
    assert main(["run", str(recipe), "--set", "precision=bf16", "--output-dir", str(run),
                 "--quiet"]) == 0
    ran = len(evaluations)
    assert ran >= 1  # the run's test evaluation(s)
    assert main(["eval", str(recipe), "--model", str(run)]) == 0  # its precision, unasked
    assert "meta: evaluating at the run's precision, bf16" in capsys.readouterr().out
    assert len(evaluations) == ran + 1
    for executor, training, placement in evaluations:
        assert executor.precision == "bf16" and executor.plan_precision == "bf16"
        assert not training
        products = [w for n, w in placement.items() if w.startswith("onednn")]
        assert products and all(w == "onednn bf16" for w in products), placement
    # --set wins over the run's; a model file alone (no metrics.json) is the recipe's
    assert main(["eval", str(recipe), "--model", str(run), "--set", "precision=f32"]) == 0
    assert main(["eval", str(recipe), "--model", str(run / "model.onnx")]) == 0
    assert [e[0].precision for e in evaluations[-2:]] == ["f32", "f32"]
    assert "evaluating at the run's precision" not in capsys.readouterr().out
