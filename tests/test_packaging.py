"""What the wheel holds: meta with its operator library as meta.ops (never a top-level ops
that would shadow a user's ops.py), and the shipped recipes with their data and model.

The wheel is built by the real backend without its C++ step (``wheel.cmake=false``): seconds,
where the full build takes minutes (12.5 on the 2-core machine). The full wheel, installed into
a fresh virtual environment, ran ``meta run mnist_mlp`` from an empty folder by hand (the
README's "Install" notes); a test of it would cost that build and a download of every
dependency.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("scikit_build_core") is None,
                    reason="needs scikit-build-core (pip install -e '.[test]')")
def test_the_wheel_holds_meta_ops_and_the_recipes_and_nothing_else(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-C", "wheel.cmake=false", "-C", f"build-dir={tmp_path / 'build'}",
                    "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, text=True, timeout=600)
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith("meta_dnn-")  # the distribution: "meta" on PyPI is another's
    names = set(zipfile.ZipFile(wheel).namelist())
    (info,) = {n.split("/")[0] for n in names} - {"meta"}  # no top-level ops, nor anything
    assert info.startswith("meta_dnn-") and info.endswith(".dist-info")
    ops = {p.name for p in (REPO / "ops").glob("*.py")}
    assert {f"meta/ops/{name}" for name in ops} <= names
    recipes = {str(p.relative_to(REPO)) for p in (REPO / "recipes").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert {f"meta/{r}" for r in recipes} <= names
    assert {"meta/recipes/mnist_mlp.py", "meta/recipes/models/mnist_cnn.onnx",
            "meta/recipes/data/digits14.npz"} <= names
