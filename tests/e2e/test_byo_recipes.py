"""The bring-your-own recipes: a PyTorch-exported ONNX model, arrays from .npz with an event and
a metric of the recipe's own, a folder of images, a dataset function, a strategy class."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from .recipe_checks import run_shipped_recipe

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")

pytestmark = pytest.mark.slow


def test_a_pytorch_exported_model_trains(tmp_path, mnist_dir):
    report = run_shipped_recipe("onnx_model", tmp_path, timeout=300)
    assert report["definitions"]["model"] == "onnx"
    assert report["metrics"]["test_accuracy"] >= 0.96
    trained = {t.name: numpy_helper.to_array(t)
               for t in onnx.load(str(tmp_path / "model.onnx")).graph.initializer}
    original = {t.name: numpy_helper.to_array(t) for t in onnx.load(
        str(REPO / "recipes" / "models" / "mnist_cnn.onnx")).graph.initializer}
    assert {"0.weight", "1.running_mean", "9.bias"} <= trained.keys()
    assert abs(trained["1.running_mean"] - original["1.running_mean"]).max() > 1e-3


def test_arrays_with_the_recipes_own_event_and_metric(tmp_path):
    report = run_shipped_recipe("arrays_npz", tmp_path, timeout=300)
    assert report["metrics"]["worst_class_recall"] >= 0.75  # the recipe's metric class
    rows = (tmp_path / "update_norms.csv").read_text().splitlines()  # the recipe's event
    assert len(rows) >= 10 and all(float(r.split(",")[1]) > 0 for r in rows)


@pytest.mark.parametrize("name", ["image_folder", "callable_dataset"])
def test_datasets_from_a_folder_and_a_function(tmp_path, name):
    report = run_shipped_recipe(name, tmp_path, timeout=300)
    assert report["passed"]


@pytest.mark.mpi
def test_a_strategy_defined_in_the_recipe_under_mpiexec(tmp_path, mnist_dir, mpirun):
    out = mpirun(2, [META, "run", str(REPO / "recipes" / "custom_strategy.py"), "--output-dir",
                     str(tmp_path), "--quiet"], timeout=300)
    assert out.count("custom_strategy: PASS") == 1, out
    metrics = json.loads((tmp_path / "metrics.json").read_text())["metrics"]
    n_params = 784 * 128 + 128 + 128 * 10 + 10
    assert metrics["bytes_sent_per_step"] == 4 * n_params / 2  # one allreduce every 2 steps
