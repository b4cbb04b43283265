"""Training features a recipe defines (issue 45 item 2): gradient accumulation equal to a larger
batch, learning-rate warm-up in steps, an exponential moving average of the weights, step
logs, a TensorBoard event file, evaluation time apart from training time, ``meta eval``."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from meta.lv2 import OPTIMIZERS, Event
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


class _Weights(Event):
    """Every step's weights, copied."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer, observation):
        self.seen.append({k: np.array(v) for k, v in trainer.executor.graph.parameters.items()})


def test_ema_the_evaluated_and_kept_weights_are_the_average():
    from tests.lv2.test_trainer import make_trainer

    plain_steps = _Weights()
    plain = make_trainer([plain_steps])
    plain.fit(2)
    averaged = make_trainer(ema_decay=0.9)
    averaged.fit(2)
    # training itself is the same (the average is swapped in to evaluate, then out again)
    assert [m["train_loss"] for m in averaged.history] == \
        [m["train_loss"] for m in plain.history]
    expected = {k: v.copy() for k, v in plain_steps.seen[0].items()}
    for weights in plain_steps.seen[1:]:
        for k in expected:
            expected[k] = 0.9 * expected[k] + 0.1 * weights[k]
    kept = averaged.executor.graph.parameters
    assert max(float(np.max(np.abs(kept[k] - expected[k]))) for k in kept) < 1e-6
    assert max(float(np.max(np.abs(kept[k] - plain_steps.seen[-1][k]))) for k in kept) > 1e-3
    # the last epoch's test metrics are the average's: evaluated again on the kept weights
    assert averaged.evaluate(averaged.test_data, "test_")["test_loss"] == \
        pytest.approx(averaged.history[-1]["test_loss"], rel=1e-6)
    assert averaged.history[-1]["test_loss"] != plain.history[-1]["test_loss"]


def test_ema_through_the_runner_exports_the_average(tmp_path):
    plain, _ = _run(tmp_path, "plain", {"optimizer": {"name": "sgd", "lr": 0.1}}, epochs=2)
    ema, _ = _run(tmp_path, "ema", {"optimizer": {"name": "sgd", "lr": 0.1}}, epochs=2,
                  ema_decay=0.95)
    assert [m["train_loss"] for m in ema.history] == [m["train_loss"] for m in plain.history]
    assert ema.metrics["test_loss"] != plain.metrics["test_loss"]
    assert any(not np.allclose(ema.parameters[k], plain.parameters[k]) for k in ema.parameters)


def test_eval_time_is_apart_from_train_time(tmp_path, monkeypatch):
    import time

    from meta.lv2 import Trainer

    plain, printed = _run(tmp_path, "plain", epochs=2)
    assert plain.metrics["eval_time_s"] > 0 and plain.metrics["train_time_s"] > 0
    assert "eval_time_s" in printed and "train_time_s" in printed
    evaluate = Trainer.evaluate

    def slow(self, *args, **kwargs):  # each end-of-epoch evaluation takes a second more
        time.sleep(1.0)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "evaluate", slow)
    slowed, _ = _run(tmp_path, "slow", epochs=2)
    assert slowed.metrics["eval_time_s"] >= 2.0
    assert slowed.metrics["train_time_s"] < plain.metrics["train_time_s"] + 1.0, \
        (slowed.metrics, plain.metrics)


def test_log_every_prints_a_step_line(tmp_path):
    _, printed = _run(tmp_path, "log", log_every=4)  # 10 steps: lines at 4 and 8
    lines = [line for line in printed.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["4", "8"], printed
    assert "loss " in lines[0] and lines[0].endswith("steps/s")


def test_tensorboard_event_file_is_read_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboardX")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    outcome, _ = _run(tmp_path, "tb", epochs=2, log_every=5, tensorboard=True)
    files = list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    events = accumulator.EventAccumulator(str(files[0]))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "epoch/test_loss", "epoch/train_loss"} <= set(tags), tags
    assert [e.step for e in events.Scalars("train/loss")] == [5, 10, 15, 20]
    test_loss = [e.value for e in events.Scalars("epoch/test_loss")]
    assert test_loss == pytest.approx([h["test_loss"] for h in outcome.history], rel=1e-6)


def test_tensorboard_without_the_library_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(RecipeError, match=r"tensorboard: True needs tensorboardX: pip install "
                                          r"'meta\[tensorboard\]'"):
        _run(tmp_path, "none", tensorboard=True)


def _meta(*args: str, cwd: Path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    return subprocess.run([sys.executable, "-m", "meta", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


EVAL_RECIPE = '''
from meta.run.recipe import AtLeast, AtMost
FIXED = {"dataset": {"name": "arrays", "path": "blobs.npz", "test_fraction": 0.2,
                     "normalize": False},
         "model": {"name": "mlp", "hidden": [16]}}
MUTABLE = {"epochs": 3, "batch_size": 32, "lr": 0.1, "seed": 0, "eval_batch_size": 1000}
METRICS = {"test_accuracy": AtLeast(%s), "test_loss": AtMost(10.0), "train_loss": AtMost(10.0)}
'''


def test_meta_eval_measures_a_saved_model_without_training(tmp_path):
    _data(tmp_path)
    (tmp_path / "r.py").write_text(EVAL_RECIPE % "0.5")
    done = _meta("run", "r.py", "--quiet", "--output-dir", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    import json

    trained = json.loads((tmp_path / "run" / "metrics.json").read_text())["metrics"]
    for model in ("run", "run/model.onnx"):
        done = _meta("eval", "r.py", "--model", model, "--set", "eval_batch_size=7",
                     cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
                if line.startswith("test_")}
        assert float(rows["test_accuracy"]) == pytest.approx(trained["test_accuracy"], abs=1e-4)
        assert float(rows["test_loss"]) == pytest.approx(trained["test_loss"], abs=1e-4)
        assert "not measured without training: train_loss" in done.stdout
        assert "eval_time_s" in done.stdout and "r: PASS" in done.stdout
    (tmp_path / "strict.py").write_text(EVAL_RECIPE % "0.999")
    done = _meta("eval", "strict.py", "--model", "run", cwd=tmp_path)
    assert done.returncode == 1 and "strict: FAIL" in done.stdout, done.stdout + done.stderr


def test_meta_eval_refuses_another_network_in_one_line(tmp_path):
    _data(tmp_path)
    (tmp_path / "r.py").write_text(EVAL_RECIPE % "0.5")
    assert _meta("run", "r.py", "--quiet", "--output-dir", "run", "--set", "epochs=1",
                 cwd=tmp_path).returncode == 0
    (tmp_path / "wide.py").write_text((EVAL_RECIPE % "0.5").replace("[16]", "[32]"))
    done = _meta("eval", "wide.py", "--model", "run", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the recipe's network has [" in done.stderr and "Traceback" not in done.stderr
    done = _meta("eval", "r.py", "--model", "nowhere", cwd=tmp_path)
    assert done.returncode == 2 and "--model nowhere: no such run folder" in done.stderr


def test_ema_resumes_from_a_checkpoint_with_its_average(tmp_path):
    from meta.lv2.checkpoint import capture, load_checkpoint, restore, save_checkpoint
    from tests.lv2.test_trainer import make_trainer

    class SaveAfterFirstEpoch(Event):
        def on_epoch_end(self, trainer, metrics):
            if metrics["epoch"] == 1:
                save_checkpoint(tmp_path / "ckpt.npz", capture(trainer))

    whole = make_trainer([SaveAfterFirstEpoch()], ema_decay=0.9)
    whole.fit(2)
    ckpt = load_checkpoint(tmp_path / "ckpt.npz")
    assert ckpt.average is not None and set(ckpt.average) == set(whole.average.average)
    resumed = make_trainer(ema_decay=0.9)
    restore(resumed, ckpt)
    resumed.fit(2)
    a, b = whole.executor.graph.parameters, resumed.executor.graph.parameters
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a) < 1e-6
    assert resumed.history[-1]["test_loss"] == pytest.approx(whole.history[-1]["test_loss"])


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_accumulate_under_a_sharded_strategy(tmp_path, strategy):
    """The accumulation is per value, so ZeRO's shard steps accumulate as the whole does (one
    process here; the shards' exchanges are ZeRO's own tests)."""
    optimizer = {"name": "adam", "lr": 0.01, "grad_clip": 0.5}
    big, _ = _run(tmp_path, "big", {"optimizer": optimizer}, batch_size=64)
    sharded, _ = _run(tmp_path, strategy, {"optimizer": {**optimizer, "accumulate": 4},
                                           "distributed": strategy}, batch_size=16)
    assert max(float(np.max(np.abs(big.parameters[k] - sharded.parameters[k])))
               for k in big.parameters) < 1e-6


LM_RECIPE = '''
from meta.run.recipe import AtMost
FIXED = {"dataset": {"name": "text", "files": [%r], "context": 8},
         "model": {"name": "lstm_lm", "hidden": 8, "embedding": 4}}
MUTABLE = {"epochs": 1, "batch_size": 8, "lr": 0.01, "seed": 0}
METRICS = {"test_loss": AtMost(100.0)}
'''


def test_meta_eval_of_a_language_model_checks_its_tokenizer(tmp_path):
    (tmp_path / "a.txt").write_text("abcd dcba abdc " * 40)
    (tmp_path / "b.txt").write_text("abce ecba abec " * 40)  # as many symbols, another one
    (tmp_path / "a.py").write_text(LM_RECIPE % "a.txt")
    (tmp_path / "b.py").write_text(LM_RECIPE % "b.txt")
    done = _meta("run", "a.py", "--quiet", "--output-dir", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    done = _meta("eval", "a.py", "--model", "run", cwd=tmp_path)
    assert done.returncode == 0 and "a: PASS" in done.stdout, done.stdout + done.stderr
    done = _meta("eval", "b.py", "--model", "run", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the model's tokenizer (char, 5 tokens) is not the one the recipe's dataset built " \
           "(char, 5 tokens)" in done.stderr, done.stderr


def test_ema_under_accumulate_averages_the_optimizer_steps(tmp_path):
    """The average moves once per optimizer step, so accumulate=4 at batch 16 averages as
    batch 64 does."""
    optimizer = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
    big, _ = _run(tmp_path, "big", {"optimizer": optimizer}, batch_size=64, ema_decay=0.8)
    small, _ = _run(tmp_path, "small", {"optimizer": {**optimizer, "accumulate": 4}},
                    batch_size=16, ema_decay=0.8)
    plain, _ = _run(tmp_path, "plain", {"optimizer": optimizer}, batch_size=64)
    assert max(float(np.max(np.abs(big.parameters[k] - small.parameters[k])))
               for k in big.parameters) < 1e-6
    assert max(float(np.max(np.abs(big.parameters[k] - plain.parameters[k])))
               for k in big.parameters) > 1e-3
