"""Kill a training run with SIGKILL mid-epoch, resume it, and get the uninterrupted weights.

The run is short (4,000 examples: 125 steps an epoch, 3 epochs): what is checked is that a
resumed run continues where the checkpoint left it, bit for bit, which does not depend on its
length. The kill lands in epoch 2 or 3, after at least one checkpoint of epoch 2, with 225
steps and two evaluations still to go before the run could end on its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from meta.lv2.checkpoint import CheckpointError, load_checkpoint
from tests.launch import clean_env, run_together

META = str(Path(sys.executable).parent / "meta")
RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": "mnist", "hidden": [256, 128], "optimizer": "adam"}
    MUTABLE = {"epochs": 3, "train_samples": 4000, "batch_size": 32, "lr": 0.001, "seed": 5}
    METRICS = {"test_accuracy": AtLeast(0.5)}
"""

KILL_AFTER_STEP = 150  # 25 steps into epoch 2: its first checkpoint

pytestmark = pytest.mark.slow


def weights(folder: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path, mnist_dir):
    recipe = tmp_path / "resume.py"
    recipe.write_text(textwrap.dedent(RECIPE))
    env = clean_env({"OMP_NUM_THREADS": "1"})  # one BLAS thread: the same sums in every run
    common = [META, "run", str(recipe), "--quiet", "--checkpoint-every", "25"]

    killed = tmp_path / "killed"
    proc = subprocess.Popen([*common, "--output-dir", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = killed / "checkpoint.npz"
    deadline = time.monotonic() + 240
    step = 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            position = load_checkpoint(checkpoint).position
            step, in_epoch = position["step"], position["batch_in_epoch"]
        except CheckpointError:
            in_epoch = 0
        if step >= KILL_AFTER_STEP and in_epoch > 0:  # epoch 2 (125 steps an epoch), mid-way
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run finished before it was killed"
    assert not (killed / "model.onnx").exists()

    # The uninterrupted run and the resumed one, one thread each, side by side (2 cores).
    whole = tmp_path / "whole"
    _, out = run_together([[*common, "--output-dir", str(whole)],
                           [*common, "--output-dir", str(killed), "--resume"]], env, timeout=300)
    assert f"resuming from {checkpoint}" in out and f"step {step}" in out
    resumed, reference = weights(killed), weights(whole)
    assert resumed.keys() == reference.keys()
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name], err_msg=name)
