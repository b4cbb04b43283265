"""Shared fixtures: MPI launching and the datasets folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from tests.launch import MPI_TIMEOUT_S, clean_env, find_mpiexec, run_command


@pytest.fixture
def mpirun() -> Callable[..., str]:
    """``mpirun(n, [program, args...], env={...})`` -> combined output of all ranks."""
    mpiexec = find_mpiexec()

    def run(n: int, args: list[str], env: dict[str, str] | None = None,
            expect_rc: int | None = 0, timeout: float = MPI_TIMEOUT_S) -> str:
        return run_command([str(mpiexec), "-n", str(n), *args], clean_env(env), timeout,
                           expect_rc)

    return run


REPO = Path(__file__).resolve().parents[1]
SHARED_MNIST = REPO.parent / "shared" / "datasets" / "mnist"


@pytest.fixture
def mnist_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The MNIST folder named by META_MNIST_DIR (CI sets it), else ../shared/datasets/mnist."""
    folder = Path(os.environ.get("META_MNIST_DIR") or SHARED_MNIST)
    if not folder.is_absolute():
        folder = REPO / folder
    if not folder.is_dir():
        pytest.fail(f"MNIST files not found in {folder}: set META_MNIST_DIR to a folder holding "
                    "the four MNIST .gz files", pytrace=False)
    monkeypatch.setenv("META_MNIST_DIR", str(folder))
    return folder
