"""Ranks agree on what they run (``meta.lv3.comm.agreement``), and a rank that fails before a
collective ends the job instead of leaving the others waiting: the checks of
``agreement_checks.py`` at size 1 and under ``mpiexec -n 2`` / ``-n 3``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.lv3 import SingleProcessCommunicator
from meta.lv3.comm.agreement import _disagreement, digest, fingerprint

from . import agreement_checks

SCRIPT = str(Path(agreement_checks.__file__))


@pytest.mark.parametrize("name", list(agreement_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    agreement_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=60)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(agreement_checks.CHECKS)} checks passed" in out, out


@pytest.mark.mpi
@pytest.mark.slow
def test_an_uncaught_exception_on_one_rank_ends_the_job(mpirun: Callable[..., str]) -> None:
    start = time.monotonic()
    out = mpirun(2, [sys.executable, SCRIPT, "--raise-on-rank", "1"], expect_rc=2, timeout=30)
    assert time.monotonic() - start < 10, out
    assert "OSError: rank 1 cannot read its data" in out, out
    assert "meta: rank 1 of 2 stopped on an uncaught OSError; ending all 2 ranks" in out, out


def test_digests() -> None:
    assert digest({"a": 1, "b": [1, 2]}) == digest({"b": (1, 2), "a": 1})
    assert digest(0.1) != digest(0.1000000001) and digest(1) != digest("1")
    a = np.arange(6, dtype=np.float32)
    assert digest(a) == digest(a.copy()) != digest(a.astype(np.float64))
    assert digest(a) != digest(a.reshape(2, 3))


def test_large_arrays_are_sampled_by_rows() -> None:
    big = np.zeros((1000, 100), np.float32)  # 400 kB
    other = big.copy()
    other[0, 0] = 1  # the first row is always in the sample
    assert fingerprint(big, max_bytes=4000) != fingerprint(other, max_bytes=4000)
    unsampled = big.copy()
    unsampled[1, 0] = 1  # 10 rows of 1000 are hashed: row 1 is not one of them
    assert fingerprint(big, max_bytes=4000) == fingerprint(unsampled, max_bytes=4000)
    assert fingerprint(big) != fingerprint(unsampled)  # all of it, under the default limit


def test_disagreement_message() -> None:
    same = {"lr": ("d1", "0.1")}
    assert _disagreement([same, same], "the run") is None
    message = _disagreement([same, {"lr": ("d2", "0.2")}, same, {}], "the run")
    assert message == ("ranks disagree on the run: 'lr' (0.1 on ranks 0, 2; 0.2 on rank 1; "
                       "missing on rank 3); start every rank with the same recipe, --set "
                       "values and data")
