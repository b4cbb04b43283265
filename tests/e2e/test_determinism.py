"""The same recipe and seed give bit-identical final weights, run after run.

Each run is a separate process (nothing cached in memory can help), on one process and under
synchronous allreduce with ``mpiexec -n 2``. The weights are read back from the exported ONNX
model, where they are stored as raw float32 bytes.

Threads are pinned to 1 per process: OpenBLAS and OpenMP may split a reduction differently
with a different thread count, so bit-identity is promised for a fixed thread count, not across
thread counts (the README's "Benchmark reports" says so).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from tests.launch import clean_env, run_together

META = str(Path(sys.executable).parent / "meta")
SMALL = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": "mnist", "hidden": [32]}
    MUTABLE = {"epochs": 2, "train_samples": 1000, "batch_size": 50, "lr": 0.05, "seed": 3}
    METRICS = {"test_accuracy": AtLeast(0.5)}
"""
PINNED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

pytestmark = pytest.mark.slow


def weights(model: Path) -> dict[str, bytes]:
    return {t.name: numpy_helper.to_array(t).tobytes()
            for t in onnx.load(str(model)).graph.initializer}


def assert_identical(first: Path, second: Path) -> None:
    a, b = weights(first / "model.onnx"), weights(second / "model.onnx")
    assert a and sorted(a) == sorted(b)
    differing = [name for name in a if a[name] != b[name]]
    assert not differing, f"weights differ between identical runs: {differing}"
    assert curves(first) == curves(second)


def curves(run: Path) -> list[dict[str, float]]:
    """Per-epoch losses and accuracies (times and rates differ between runs, by nature)."""
    history = json.loads((run / "metrics.json").read_text())["history"]
    return [{k: v for k, v in epoch.items() if "loss" in k or "accuracy" in k}
            for epoch in history]


@pytest.fixture
def recipe(tmp_path: Path) -> str:
    path = tmp_path / "small.py"
    path.write_text(textwrap.dedent(SMALL))
    return str(path)


def test_single_process_runs_are_bit_identical(tmp_path, recipe, mnist_dir):
    """The two runs go side by side (one thread each, 2 cores): separate processes still, and
    with one thread what runs beside a process cannot change its sums."""
    runs = [tmp_path / "run1", tmp_path / "run2"]
    run_together([[META, "run", recipe, "--output-dir", str(out), "--quiet"] for out in runs],
                 clean_env(PINNED), timeout=120)
    assert_identical(*runs)


@pytest.mark.mpi
def test_allreduce_runs_on_two_ranks_are_bit_identical(tmp_path, recipe, mnist_dir, mpirun):
    runs = [tmp_path / "run1", tmp_path / "run2"]
    for out in runs:
        printed = mpirun(2, [META, "run", recipe, "--output-dir", str(out), "--quiet"],
                         env=PINNED, timeout=120)
        assert "on 2 ranks" in printed
    assert_identical(*runs)
