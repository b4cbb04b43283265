"""A worker lost at the very end is survived too (issue 44): killed right after its last step,
or during the final evaluation, under Open MPI with ULFM, Downpour, ``async_rma`` and the
asynchronous parameter server still PASS and write ``model.onnx`` and ``metrics.json`` (before,
``async_rma`` exited 2 with neither in 6 of 6 kills after the last epoch, and Downpour printed
PASS and never exited in 1 of 3). A pipeline that loses a stage exits non-zero with one line.

3 ranks (2 workers and a server; the pipeline's 3 stages), MNIST's first 3000 examples, 2
epochs. One run per case here (CI); ``tools/survive_late_loss.sh`` runs each case 5 times, the
issue's acceptance. Skipped, saying why, without Open MPI (``$META_OPENMPI_PYTHON``, as in
``tests/e2e/test_survive_worker_loss.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.test_survive_worker_loss import OPTIMIZERS, OPENMPI_PYTHON, launch_flags, \
    ulfm_missing
from tests.launch import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

RANKS, EPOCHS, BATCH, SAMPLES = 3, 2, 32, 3000
WORKERS = RANKS - 1
STEPS = -(-SAMPLES // WORKERS // BATCH) * EPOCHS  # a worker's last step

RECIPE = """
    import os
    import signal
    import time
    from pathlib import Path

    from meta.common.component import Option
    from meta.lv2 import Event, register_event
    from meta.lv3 import world
    from meta.run.recipe import AtLeast


    @register_event("die_late")
    class DieLate(Event):
        options = {{"rank": Option(1, "the world rank that dies", low=0),
                    "when": Option("last_step", "last_step or final_evaluation"),
                    "steps": Option(1, "its last step", low=1),
                    "epochs": Option(1, "the run's epochs", low=1),
                    "marks": Option(".", "folder of the kill's time")}}

        def __init__(self, rank, when, steps, epochs, marks):
            self.rank, self.when, self.steps = rank, when, steps
            self.epochs, self.marks = epochs, Path(marks)

        def _die(self):
            if world().rank == self.rank:
                (self.marks / "killed_at").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

        def on_step_end(self, trainer, observation):
            if self.when == "last_step" and observation["step"] == self.steps:
                self._die()

        def on_eval_batch(self, trainer):
            if self.when == "final_evaluation" and len(trainer.history) + 1 == self.epochs:
                self._die()


    FIXED = {{"dataset": "mnist", "model": {{"name": "mlp", "hidden": [64]}},
             "events": [{{"name": "die_late", "rank": {rank}, "when": {when!r},
                         "steps": {steps}, "epochs": {epochs}, "marks": {marks!r}}}]}}
    MUTABLE = {{"distributed": {strategy!r}, **{optimizer!r}, "epochs": {epochs},
               "batch_size": {batch}, "train_samples": {samples}, "seed": 0}}
    METRICS = {{"test_accuracy": AtLeast(0.8)}}
"""


def run_late(folder: Path, strategy: str, when: str, rank: int, expect_rc: int | None,
             optimizer: dict | None = None) -> tuple[int, str, float]:
    """The recipe on RANKS ranks with ``rank`` killing itself ``when``; the exit status, the
    output and the seconds from the kill to the job's end."""
    reason = ulfm_missing()
    if reason:
        pytest.skip(reason)
    marks = folder / "marks"
    marks.mkdir(parents=True)
    recipe = folder / "late.py"
    recipe.write_text(textwrap.dedent(RECIPE.format(
        rank=rank, when=when, steps=STEPS, epochs=EPOCHS, marks=str(marks), batch=BATCH,
        samples=SAMPLES, strategy=strategy, optimizer=optimizer or OPTIMIZERS[strategy])))
    python = Path(OPENMPI_PYTHON)
    proc = subprocess.Popen([str(python.parent / "mpiexec"), *launch_flags(), "-n", str(RANKS),
                             str(python), "-m", "meta.cli", "run", str(recipe), "--quiet",
                             "--output-dir", str(folder / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=clean_env({"OMP_NUM_THREADS": "1"}))
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # a hang: Downpour printed PASS and never exited
        out, _ = proc.communicate()
        pytest.fail(f"no end within 180 s ({when}):\n{out}", pytrace=False)
    ended, out = time.time(), out.replace("\0", "")  # Open MPI's output can hold NUL bytes
    assert (marks / "killed_at").exists(), f"rank {rank} never died ({when}):\n{out}"
    if expect_rc is not None:
        assert proc.returncode == expect_rc, f"exit {proc.returncode} ({when}):\n{out}"
    return proc.returncode, out, ended - float((marks / "killed_at").read_text())


@pytest.mark.parametrize("when", ["last_step", "final_evaluation"])
@pytest.mark.parametrize("strategy", sorted(OPTIMIZERS))
def test_a_worker_lost_at_the_end_is_survived(tmp_path: Path, mnist_dir, strategy: str,
                                              when: str) -> None:
    _, out, _ = run_late(tmp_path, strategy, when, rank=1, expect_rc=0)
    check_late_survival(tmp_path / "out", out, victim=1)


def check_late_survival(folder: Path, out: str, victim: int) -> None:
    """PASS, the loss reported once, model.onnx and a passing metrics.json written, nothing
    half-written or locked left."""
    assert "late: PASS" in out, out
    assert len([line for line in out.splitlines()
                if f"meta: lost worker rank {victim}:" in line]) == 1, out
    report = json.loads((folder / "metrics.json").read_text())
    assert report["passed"] and report["metrics"]["workers_died"] == 1, out
    assert (folder / "model.onnx").is_file(), out
    leftovers = [p.name for p in folder.iterdir() if p.suffix in (".tmp", ".stale", ".lock")]
    assert leftovers == [], out


@pytest.mark.parametrize("when", ["last_step", "final_evaluation"])
def test_a_pipeline_that_lost_a_stage_exits_non_zero_with_one_line(tmp_path: Path, mnist_dir,
                                                                   when: str) -> None:
    code, out, seconds = run_late(tmp_path, "pipeline", when, rank=1, expect_rc=None,
                                  optimizer={"optimizer": "sgd", "lr": 0.05, "momentum": 0.5})
    assert code not in (0, 1), f"exit {code}:\n{out}"  # it was 0 under ULFM
    errors = [line for line in out.splitlines() if line.startswith("meta: error")]
    assert "Traceback" not in out and "late: PASS" not in out, out
    assert errors and all("rank 1 of 3 died" in line or "another rank ended the run" in line
                          for line in errors), out
    assert not (tmp_path / "out" / "metrics.json").exists(), out
    assert seconds < 10, out
