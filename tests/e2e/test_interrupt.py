"""Ctrl-C and SIGTERM end a run with one line, a checkpoint of the step it reached, the lock
released and exit 130 / 143, under ``mpiexec`` too (issue 28): never a traceback, never exit 2
(which means a user error). ``--resume`` then continues from that checkpoint. A signal during
the end-of-epoch evaluation acts between its batches, within 2 s (issue 44: 7.5-19.6 s)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.launch import MPI_TIMEOUT_S, clean_env, find_mpiexec

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": {"name": "synthetic", "train_examples": 8192, "test_examples": 64,
                         "input_shape": [8]}, "model": {"name": "mlp", "hidden": [8]}}
    MUTABLE = {"epochs": 40, "batch_size": 16, "lr": 0.1}
    METRICS = {"test_accuracy": AtLeast(0.0)}
"""


# An evaluation of seconds after each epoch of 2 steps (about 0.9 TFLOP a rank: 5-10 s on
# these CPUs in float32): a signal soon after the start lands in it.
EVALUATING = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": {"name": "synthetic", "train_examples": 64, "test_examples": 200000,
                         "input_shape": [32]}, "model": {"name": "mlp", "hidden": [2048, 2048]}}
    MUTABLE = {"epochs": 40, "batch_size": 16, "lr": 0.1, "eval_batch_size": 256}
    METRICS = {"test_accuracy": AtLeast(0.0)}
"""
ACT_S = 2.0  # the bound from the signal to mpiexec's end


@pytest.mark.parametrize("signum,code,during", [(signal.SIGINT, 130, "training"),
                                                (signal.SIGTERM, 143, "training"),
                                                (signal.SIGTERM, 143, "evaluation")],
                         ids=["ctrl-c", "sigterm", "sigterm-evaluating"])
def test_a_signal_to_mpiexec_checkpoints_and_exits_with_its_code(tmp_path: Path, signum: int,
                                                                 code: int, during: str) -> None:
    recipe = tmp_path / "long.py"
    recipe.write_text(textwrap.dedent(RECIPE if during == "training" else EVALUATING))
    out = tmp_path / "out"
    run = [sys.executable, "-m", "meta", "run", str(recipe), "--output-dir", str(out),
           "--quiet"]
    proc = subprocess.Popen([str(find_mpiexec()), "-n", "2", *run], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    try:
        for line in proc.stdout:  # training has started once the header is out
            if line.startswith("epoch"):
                break
        time.sleep(0.5 if during == "training" else 1.0)
        proc.send_signal(signum)  # what a terminal's Ctrl-C or a scheduler's kill does
        sent = time.monotonic()
        _, err = proc.communicate(timeout=MPI_TIMEOUT_S)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    name = signal.Signals(signum).name
    assert proc.returncode == code, err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines() if line.startswith("meta:")]
    assert len(ours) == 1 and ours[0].startswith(f"meta: interrupted by {name} at epoch "), err
    assert took < ACT_S, f"{took:.1f} s from the signal to the end: {err}"
    assert ("(evaluating)" in ours[0]) == (during == "evaluation"), err
    assert f"checkpoint written to {out / 'checkpoint.npz'} (continue with --resume)" in ours[0]
    assert not (out / "run.lock").exists() and not list(out.glob("*.tmp"))
    from meta.lv2 import load_checkpoint

    done = load_checkpoint(out / "checkpoint.npz").position["epoch"]
    resumed = subprocess.run([str(find_mpiexec()), "-n", "2", *run, "--resume", "--set",
                              f"epochs={done + 1}"], capture_output=True, text=True,
                             env=clean_env(), timeout=MPI_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stderr
    assert "meta: resuming from" in resumed.stdout and (out / "metrics.json").is_file()


def test_a_signal_to_meta_launch_reaches_the_ranks(tmp_path: Path) -> None:
    """``meta launch`` signals the ranks themselves (Open MPI's mpirun would SIGKILL them a
    moment after its SIGTERM, under ULFM before a checkpoint, and exit 1): the checkpoint, the
    ranks' line and the launcher's, exit 143."""
    recipe = tmp_path / "long.py"
    recipe.write_text(textwrap.dedent(RECIPE))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "meta", "launch", "-n", "2", str(recipe),
                             "--output-dir", str(out), "--quiet"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=clean_env(),
                            start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("epoch"):
                break
        time.sleep(1.0)  # the launcher has found the ranks' pids (it looks every 0.5 s)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=MPI_TIMEOUT_S)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143 and took < ACT_S, (took, err)
    lines = [line.strip() for line in err.splitlines() if "meta" in line]
    assert lines[0].startswith("meta: interrupted by SIGTERM at epoch "), err
    assert lines[-1].startswith("meta launch: stopped by SIGTERM; checkpoint "
                                f"{out / 'checkpoint.npz'} (epoch "), err
    assert lines[-1].endswith("(continue with --resume)") and len(lines) == 2, err
    assert not (out / "run.lock").exists() and not list(out.glob("*.tmp"))
