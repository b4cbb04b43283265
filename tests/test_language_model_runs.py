"""Token-id models through the runner (what ``meta run`` does): a GPT and an LSTM on a user's
text file, on the reference, planned and PyTorch executors; the shipped language-model recipes
shortened (slow)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import AtMost, load_recipe, make_recipe
from meta.run.runner import run_recipe

REPO = Path(__file__).resolve().parents[1]
TEXT = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n" * 12


def _run(tmp_path, model, executor):
    (tmp_path / "play.txt").write_text(TEXT)
    recipe = make_recipe("lm", {
        "dataset": {"name": "text", "files": [str(tmp_path / "play.txt")], "context": 16},
        "model": model, "optimizer": "adam", "executor": executor,
        "events": [{"name": "sample_text", "length": 20, "prompt": "Ro"}],
    }, {"epochs": 3, "batch_size": 8, "lr": 1e-2, "seed": 0},
        {"test_loss": AtMost(2.5), "perplexity": AtMost(12.0)})
    out = io.StringIO()
    outcome = run_recipe(recipe, SingleProcessCommunicator(), stream=out, progress=False,
                         export_onnx=False, output_dir=tmp_path / "run")
    return outcome, out.getvalue()


@pytest.mark.parametrize("executor", ["reference", "planned", "pytorch"])
@pytest.mark.parametrize("model", [
    {"name": "gpt", "layers": 1, "heads": 2, "width": 16},
    {"name": "lstm_lm", "hidden": 32, "embedding": 8},
])
def test_token_id_models_train_through_the_runner(tmp_path, capsys, model, executor):
    if executor == "pytorch":
        pytest.importorskip("torch")
    outcome, _ = _run(tmp_path, model, executor)
    history = outcome.history
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.3
    assert outcome.passed, outcome.table()
    printed = capsys.readouterr().out
    assert printed.count("--- sample after epoch") == 3 and "\nRo" in printed


def _meta_run(recipe: str, output: Path, *sets: str, timeout: int) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "meta", "run", recipe, "--quiet", "--no-export",
                           "--output-dir", str(output), *[a for s in sets for a in ("--set", s)]],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["shakespeare_gpt", "shakespeare_lstm"])
def test_the_shakespeare_recipes_shortened(recipe, tinyshakespeare_dir, tmp_path):
    """A few hundred blocks for one epoch, validated on 1 % of the blocks (the LSTM runs as a
    Python step in plans: evaluating the full 10 % took minutes): the loss falls and a sample
    prints (the bound is the full run's, so this checks the verdict is reported, not that it
    passes)."""
    if tinyshakespeare_dir is None:
        pytest.skip("no Tiny Shakespeare in ../shared/datasets (nor $META_TINYSHAKESPEARE_DIR)")
    assert load_recipe(REPO / "recipes" / f"{recipe}.py").metrics["test_loss"]
    code, out = _meta_run(f"recipes/{recipe}.py", tmp_path, "dataset.train_samples=640",
                          "dataset.validation=0.01", "epochs=1", timeout=900)
    assert "--- sample after epoch 1 ---" in out, out[-3000:]
    loss = float(re.search(r"^test_loss\s+(\S+)", out, re.M).group(1))
    assert loss < 3.6, out[-3000:]  # from ln(65) = 4.17 at chance
    assert code in (0, 1) and f"{recipe}: " in out, out[-3000:]
