"""Recipes on PyTorch: the shipped MLP and LeNet-5 recipes PASS with ``executor=pytorch`` (same
bounds), data-parallel through meta's allreduce and an asynchronous strategy, and PyTorch's
optimizers chosen by name. Skipped without PyTorch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'meta[torch]')")

from tests.launch import clean_env, run_command  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")

pytestmark = pytest.mark.slow
CUDA = torch.cuda.is_available()

# A small MNIST recipe whose executor, optimizer and strategy are MUTABLE.
SMALL = """
from meta.run.recipe import AtLeast, AtMost
FIXED = {"dataset": {"name": "mnist", "train_samples": 20000},
         "model": {"name": "mlp", "hidden": [256, 128]}}
MUTABLE = {"epochs": 2, "batch_size": 64, "optimizer": {"name": "torch_sgd", "momentum": 0.9},
           "lr": 0.05, "seed": 0, "executor": "pytorch", "distributed": "allreduce"}
METRICS = {"test_accuracy": AtLeast(0.93), "train_time_s": AtMost(300)}
"""


def _run(args: list[str], out: Path, name: str, timeout: float = 600) -> dict:
    printed = run_command([*args, "--output-dir", str(out), "--quiet"], clean_env(), timeout)
    assert printed.count(f"{name}: PASS") == 1, printed
    report = json.loads((out / "metrics.json").read_text())
    report["printed"] = printed
    return report


@pytest.mark.parametrize("recipe, bound", [("mnist_mlp", 0.975), ("mnist_lenet", 0.988)])
def test_shipped_recipe_passes_on_the_pytorch_executor(recipe, bound, tmp_path, mnist_dir):
    report = _run([META, "run", str(REPO / "recipes" / f"{recipe}.py"), "--set",
                   "executor=pytorch"], tmp_path, recipe)
    assert report["definitions"]["executor"] == "pytorch"
    assert report["metrics"]["test_accuracy"] >= bound
    assert (tmp_path / "model.onnx").exists()  # exported from the graph's own arrays


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA device")
def test_lenet_recipe_trains_on_a_gpu(tmp_path, mnist_dir):
    report = _run([META, "run", str(REPO / "recipes" / "mnist_lenet.py"), "--set",
                   "executor=pytorch", "--set", "device=cuda"], tmp_path, "mnist_lenet")
    assert report["metrics"]["test_accuracy"] >= 0.988
    assert (tmp_path / "model.onnx").exists()


@pytest.mark.mpi
def test_mlp_recipe_data_parallel_on_pytorch_through_allreduce(tmp_path, mnist_dir, mpirun):
    out = mpirun(2, [META, "run", str(REPO / "recipes" / "mnist_mlp.py"), "--set",
                     "executor=pytorch", "--output-dir", str(tmp_path), "--quiet"], timeout=300)
    assert out.count("mnist_mlp: PASS") == 1, out
    assert "running recipe mnist_mlp on 2 ranks" in out
    assert "to_host" in out  # the gradients' device-to-host phase in the step timeline
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.975


@pytest.mark.mpi
def test_asynchronous_strategy_and_torch_optimizer_on_pytorch(tmp_path, mnist_dir, mpirun):
    recipe = tmp_path / "small_torch.py"
    recipe.write_text(SMALL)
    out = mpirun(3, [META, "run", str(recipe), "--set", "distributed=async_rma",
                     "--output-dir", str(tmp_path / "rma"), "--quiet"], timeout=300)
    assert out.count("small_torch: PASS") == 1, out
    report = json.loads((tmp_path / "rma" / "metrics.json").read_text())
    assert report["definitions"]["distributed"] == "async_rma"
    assert report["definitions"]["optimizer"] == "torch_sgd"


def test_torch_optimizer_with_meta_native_executor(tmp_path, mnist_dir):
    recipe = tmp_path / "small_torch.py"
    recipe.write_text(SMALL)
    report = _run([META, "run", str(recipe), "--set", "executor=native", "--set",
                   "optimizer=torch_adam", "--set", "lr=0.002"], tmp_path / "out", "small_torch")
    assert report["definitions"]["optimizer"] == "torch_adam"
