"""Launching ``mpiexec`` (and plain subprocesses) from tests: bounded in time, output kept."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meta.common.threads import THREAD_VARIABLES

MPI_TIMEOUT_S = 120
# Variables of an outer launcher (if pytest itself runs under one) must not leak into ours.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_")
# ... except a user's settings for Open MPI's mpiexec (running as root), which no launcher sets.
KEPT_LAUNCHER_VARIABLES = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def find_mpiexec() -> Path:
    """The ``mpiexec`` of this environment's ``mpich`` wheel, else the one on PATH."""
    candidate = Path(sys.executable).parent / "mpiexec"
    if candidate.exists():
        return candidate
    found = shutil.which("mpiexec")
    if found is None:
        pytest.fail(
            f"mpiexec not found: neither {candidate} nor on PATH; install the `mpich` wheel "
            "into this environment (pip install mpich)",
            pytrace=False,
        )
    return Path(found)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without thread or launcher variables, plus ``extra``."""
    env = {
        k: v for k, v in os.environ.items()
        if k not in THREAD_VARIABLES
        and (k in KEPT_LAUNCHER_VARIABLES or not k.startswith(LAUNCHER_PREFIXES))
    }
    env.update(extra or {})
    return env


def run_command(cmd: list[str], env: dict[str, str], timeout: float = MPI_TIMEOUT_S,
                expect_rc: int | None = 0, cwd: str | os.PathLike | None = None) -> str:
    """Run ``cmd`` (in ``cwd``) in its own process group; fail with its output on timeout, or
    when its exit code is not ``expect_rc`` (None accepts any)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, cwd=cwd)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpiexec and the ranks it started (a deadlock)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout} s; output:\n{out}", pytrace=False)
    if expect_rc is not None and proc.returncode != expect_rc:
        pytest.fail(f"{' '.join(cmd)} exited with {proc.returncode}, expected {expect_rc}; "
                    f"output:\n{out}", pytrace=False)
    return out


def run_together(cmds: list[list[str]], env: dict[str, str], timeout: float = MPI_TIMEOUT_S,
                 expect_rc: int | None = 0) -> list[str]:
    """Run independent ``cmds`` at the same time and return their outputs in order; fail as
    ``run_command`` does (every output shown) when one exits otherwise than ``expect_rc`` or
    they outlast ``timeout`` together, killing any still running. For runs of one thread each,
    whose results cannot depend on what runs beside them: on the 2-core CI machine two such
    runs take about the time of one."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env, start_new_session=True) for cmd in cmds]
    deadline, outs, failure = time.monotonic() + timeout, [], ""
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=max(0.0, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        failure = f"timed out after {timeout} s"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        outs += [proc.communicate()[0] for proc in procs[len(outs):]]
    codes = [proc.returncode for proc in procs]
    if not failure and expect_rc is not None and any(code != expect_rc for code in codes):
        failure = f"exited with {codes}, expected {expect_rc} each"
    if failure:
        shown = "\n".join(f"$ {' '.join(cmd)}\n{out}" for cmd, out in zip(cmds, outs))
        pytest.fail(f"runs side by side {failure}; outputs:\n{shown}", pytrace=False)
    return outs
