"""A user-written optimizer, registered in a recipe file, trains single-process and under the
Level 3 allreduce strategy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "recipes" / "mnist_signum.py")
META = str(Path(sys.executable).parent / "meta")
SMALL = ["--set", "epochs=2", "--quiet"]

pytestmark = pytest.mark.slow


def test_custom_optimizer_single_process(tmp_path, mnist_dir):
    out = run_command([META, "run", RECIPE, "--output-dir", str(tmp_path), *SMALL], clean_env())
    assert "mnist_signum: PASS" in out
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["definitions"]["optimizer"] == "signum"


@pytest.mark.mpi
def test_custom_optimizer_under_allreduce(tmp_path, mnist_dir, mpirun):
    out = mpirun(2, [META, "run", RECIPE, "--output-dir", str(tmp_path), *SMALL], timeout=300)
    assert "running recipe mnist_signum on 2 ranks" in out and "mnist_signum: PASS" in out
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["definitions"]["distributed"] == "allreduce"
