"""The checks of ``mpi_checks.py``: in-process at size 1, under ``mpiexec -n 2`` and ``-n 4``."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Callable

import pytest

from meta.common import threads as _threads
from meta.lv3 import SingleProcessCommunicator
from tests.launch import clean_env, run_command

from . import mpi_checks

SCRIPT = str(Path(mpi_checks.__file__))
THREADS_REPORT = (
    "import meta, json, os; from threadpoolctl import threadpool_info; "
    "print('THREADS', json.dumps({'omp': os.environ.get('OMP_NUM_THREADS'), "
    "'openblas': os.environ.get('OPENBLAS_NUM_THREADS'), "
    "'blas': [i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas']}))"
)


@pytest.mark.parametrize("name", list(mpi_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    mpi_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
def test_checks_on_mpi_singleton() -> None:
    """The MPI code path at size 1: mpi4py's world without a launcher."""
    out = run_command([sys.executable, SCRIPT, "--mpi"], clean_env())
    assert f"rank 0/1: {len(mpi_checks.CHECKS)} checks passed on MPICommunicator" in out, out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4])  # 3: an asynchronous server with 2 workers
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT])
    for rank in range(n):
        expected = f"rank {rank}/{n}: {len(mpi_checks.CHECKS)} checks passed on MPICommunicator"
        assert expected in out, out


def thread_reports(out: str) -> list[dict]:
    """Each rank's report, found anywhere in the output: ``mpiexec`` relays the ranks' stdout
    and stderr through one pipe here, so one rank's words can land inside another's (seen:
    'THREADS THREADS {...}' then the second report alone on the next line). The reports are
    the JSON objects that hold "omp"."""
    return [json.loads(found) for found in re.findall(r'\{[^{}]*"omp"[^{}]*\}', out)]


@pytest.mark.mpi
@pytest.mark.slow
def test_threads_per_rank(mpirun: Callable[..., str]) -> None:
    expected = _threads.default_threads({"MPI_LOCALNRANKS": "2"})  # 1 on a 2-core machine
    out = mpirun(2, [sys.executable, "-c", THREADS_REPORT])
    reports = thread_reports(out)
    assert len(reports) == 2, out
    for report in reports:
        assert report["omp"] == report["openblas"] == str(expected), report
        assert report["blas"] and all(n == expected for n in report["blas"]), report


@pytest.mark.mpi
@pytest.mark.slow
def test_user_thread_setting_is_left_alone(mpirun: Callable[..., str]) -> None:
    out = mpirun(2, [sys.executable, "-c", THREADS_REPORT], env={"OMP_NUM_THREADS": "2"})
    reports = thread_reports(out)
    assert len(reports) == 2, out
    for report in reports:
        assert report["omp"] == "2" and report["openblas"] is None, report
        # OpenBLAS follows OMP_NUM_THREADS, capped at the cores it sees.
        assert report["blas"] == [min(2, os.cpu_count() or 1)] * len(report["blas"]), report
