"""Training features a recipe defines (issue 45 item 2): gradient accumulation equal to a larger
batch, learning-rate warm-up in steps, an exponential moving average of the weights, step
logs, a TensorBoard event file, evaluation time apart from training time, ``meta eval``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from meta.lv2 import OPTIMIZERS
from meta.lv2.optimizers import build_optimizer
from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import AtMost, RecipeError, make_recipe
from meta.run.runner import run_recipe


def _data(tmp_path: Path, n: int = 800) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int64) + 2 * (x[:, 3] > 0)
    path = tmp_path / "blobs.npz"
    np.savez(path, x=x, y=y)
    return str(path)


def _run(tmp_path: Path, out: str, fixed: dict | None = None, **mutable):
    recipe = make_recipe("features", {
        "dataset": {"name": "arrays", "path": _data(tmp_path), "test_fraction": 0.2,
                    "normalize": False},
        "model": {"name": "mlp", "hidden": [16]}, **(fixed or {})},
        {"epochs": 1, "batch_size": 64, "seed": 0, **mutable}, {"test_loss": AtMost(1e9)})
    stream = io.StringIO()
    outcome = run_recipe(recipe, SingleProcessCommunicator(), stream=stream, progress=False,
                         export_onnx=False, output_dir=tmp_path / out)
    return outcome, stream.getvalue()


@pytest.mark.parametrize("optimizer", [{"name": "sgd", "lr": 0.1, "momentum": 0.9},
                                       {"name": "adam", "lr": 0.01, "grad_clip": 0.5}])
def test_accumulate_4_at_batch_16_is_batch_64(tmp_path, optimizer):
    # 640 training examples: 10 steps of 64, or 40 micro-batches of 16 in 10 steps
    big, _ = _run(tmp_path, "big", {"optimizer": optimizer}, batch_size=64)
    small, _ = _run(tmp_path, "small", {"optimizer": {**optimizer, "accumulate": 4}},
                    batch_size=16)
    plain, _ = _run(tmp_path, "plain", {"optimizer": optimizer}, batch_size=16)
    worst = max(float(np.max(np.abs(big.parameters[k] - small.parameters[k])))
                for k in big.parameters)
    assert worst < 1e-6, worst
    apart = max(float(np.max(np.abs(big.parameters[k] - plain.parameters[k])))
                for k in big.parameters)
    assert apart > 1e-3  # without accumulation, 40 steps of 16 are another run


def _steps(options: dict, steps: int) -> list[float]:
    """The parameter's moves over ``steps`` steps of a constant gradient 1."""
    w = {"w": np.zeros(1)}
    opt = build_optimizer(OPTIMIZERS["sgd"], {"momentum": 0.0, **options}, w, 10, 1)
    moves = []
    for _ in range(steps):
        before = float(w["w"][0])
        opt.step({"w": np.ones(1)})
        moves.append(round(before - float(w["w"][0]), 12))
    return moves


def test_lr_warmup_steps_ramps_linearly():
    assert _steps({"lr": 0.1, "lr_warmup_steps": 4}, 6) == [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    assert _steps({"lr": 0.1}, 2) == [0.1, 0.1]
    # with accumulation the warm-up counts optimizer steps, not micro-batches
    assert _steps({"lr": 0.1, "lr_warmup_steps": 2, "accumulate": 2}, 6) == \
        [0.0, 0.05, 0.0, 0.1, 0.0, 0.1]
    with pytest.raises(RecipeError, match="warmup_epochs or lr_warmup_steps, not both"):
        make_recipe("r", {"optimizer": {"name": "sgd", "warmup_epochs": 1,
                                        "lr_warmup_steps": 5}}, {}, {"test_loss": AtMost(1)})


def test_accumulate_is_refused_for_another_frameworks_optimizer():
    pytest.importorskip("torch")
    with pytest.raises(Exception, match="accumulate is applied by meta's own optimizers"):
        build_optimizer(OPTIMIZERS["torch_sgd"], {"accumulate": 2}, {"w": np.zeros(1)}, 1, 1)
