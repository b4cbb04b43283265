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


def _dataset_dir(monkeypatch: pytest.MonkeyPatch, variable: str, name: str) -> Path | None:
    """The folder named by ``variable`` (CI sets it), else the team's ../shared/datasets/<name>;
    with neither, None: the loaders download into their cache (md5-checked) as for users."""
    chosen = os.environ.get(variable)
    folder = Path(chosen) if chosen else SHARED_DATASETS / name
    if not folder.is_absolute():
        folder = REPO / folder
    if chosen and not folder.is_dir():
        pytest.fail(f"${variable} is {chosen}, which is not a folder: point it at the four "
                    f"{name} .gz files", pytrace=False)
    if not folder.is_dir():
        return None
    monkeypatch.setenv(variable, str(folder))
    return folder


@pytest.fixture
def mnist_dir(monkeypatch: pytest.MonkeyPatch) -> Path | None:
    return _dataset_dir(monkeypatch, "META_MNIST_DIR", "mnist")


@pytest.fixture
def fashion_mnist_dir(monkeypatch: pytest.MonkeyPatch) -> Path | None:
    return _dataset_dir(monkeypatch, "META_FASHION_MNIST_DIR", "fashion-mnist")


@pytest.fixture
def tinyshakespeare_dir(monkeypatch: pytest.MonkeyPatch) -> Path | None:
    return _dataset_dir(monkeypatch, "META_TINYSHAKESPEARE_DIR", "tinyshakespeare")
