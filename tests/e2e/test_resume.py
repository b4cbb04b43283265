"""Kill a training run with SIGKILL mid-epoch, resume it, and get the uninterrupted weights."""

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
from tests.launch import clean_env, run_command

META = str(Path(sys.executable).parent / "meta")
RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": "mnist", "hidden": [256, 128], "optimizer": "adam"}
    MUTABLE = {"epochs": 3, "train_samples": 12000, "batch_size": 32, "lr": 0.001, "seed": 5}
    METRICS = {"test_accuracy": AtLeast(0.5)}
"""

pytestmark = pytest.mark.slow


def weights(folder: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(folder / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path, mnist_dir):
    recipe = tmp_path / "resume.py"
    recipe.write_text(textwrap.dedent(RECIPE))
    env = clean_env({"OMP_NUM_THREADS": "1"})  # one BLAS thread: the same sums in every run
    common = [META, "run", str(recipe), "--quiet", "--checkpoint-every", "25"]

    whole = tmp_path / "whole"
    run_command([*common, "--output-dir", str(whole)], env, timeout=300)

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
        if step >= 400 and in_epoch > 0:  # epoch 2 (375 steps an epoch), mid-way
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    assert proc.wait(timeout=30) == -signal.SIGKILL, "the run finished before it was killed"
    assert not (killed / "model.onnx").exists()

    out = run_command([*common, "--output-dir", str(killed), "--resume"], env, timeout=300)
    assert f"resuming from {checkpoint}" in out and f"step {step}" in out
    resumed, reference = weights(killed), weights(whole)
    assert resumed.keys() == reference.keys()
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name], err_msg=name)
