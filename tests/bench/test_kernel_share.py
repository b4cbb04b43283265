"""benchmarks/kernel_share.py runs, prints its bound and writes it (one step a variant: the
figures mean nothing), and refuses an unknown model in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_share.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], text=True, capture_output=True,
                          timeout=300)


@pytest.mark.slow
def test_kernel_share_prints_and_writes_the_bound(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "share.json"
    done = run("--models", "lstm_lm", "--rounds", "1", "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "eager/meta if the rest of meta's step cost nothing" in done.stdout
    (r,) = json.loads(out.read_text())["results"]
    assert r["model"] == "lstm_lm" and 0 < r["meta_shared_share"] <= 1
    assert r["bound"] == pytest.approx(r["median_s"]["pytorch"]["cpu"]
                                       / (r["median_s"]["meta planned"]["cpu"]
                                          * r["meta_shared_share"]))
    first = r["first_loss"]
    assert first["meta planned"] == pytest.approx(first["pytorch"], rel=1e-4)


@pytest.mark.slow  # the script imports torch before it reads its arguments
def test_kernel_share_refuses_an_unknown_model():
    pytest.importorskip("torch")
    done = run("--models", "gpt2")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "unknown model gpt2" in done.stderr
