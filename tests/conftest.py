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
SHARED_DATASETS = REPO.parent / "shared" / "datasets"


def _dataset_dir(monkeypatch: pytest.MonkeyPatch, variable: str, name: str) -> Path:
    """The folder named by ``variable`` (CI sets it), else ../shared/datasets/<name>."""
    folder = Path(os.environ.get(variable) or SHARED_DATASETS / name)
    if not folder.is_absolute():
        folder = REPO / folder
    if not folder.is_dir():
        pytest.fail(f"{name} files not found in {folder}: set {variable} to a folder holding "
                    f"the four {name} .gz files", pytrace=False)
    monkeypatch.setenv(variable, str(folder))
    return folder


@pytest.fixture
def mnist_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    return _dataset_dir(monkeypatch, "META_MNIST_DIR", "mnist")


@pytest.fixture
def fashion_mnist_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    return _dataset_dir(monkeypatch, "META_FASHION_MNIST_DIR", "fashion-mnist")
