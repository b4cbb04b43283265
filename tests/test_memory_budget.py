"""The run option ``memory_limit_gb`` (meta/run/memory_budget.py): a model whose unsharded state
per rank exceeds the cap is refused in one line (exit 2, the need, the cap, the zero3 hint)
before training, and trains under ZeRO-3 at P = 4 where its shard fits."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from meta.lv3 import SingleProcessCommunicator
from meta.planner.memory import zero_memory
from meta.run.memory_budget import MemoryBudgetError, check_memory_budget
from meta.run.recipe import AtMost, RecipeError, make_recipe
from meta.run.runner import run_recipe

META = str(Path(sys.executable).parent / "meta")
# an MLP 12 -> 256 -> 256 -> 4 under Adam, n = 4 x 70,148 bytes of parameters, capped at 0.001
# GB (1,073,742 bytes, 1.0 MB): its replica (parameters n, gradients n, Adam's 2n, the flat
# gradient buffer n: 5n = 1.3 MB) does not fit; ZeRO-3 at 4 ranks (n/4 + n/4 + n/2 and 2 layer
# groups' buffers 3n/2: 2.5n = 0.7 MB) does; in one process (4n) it does not, at 2 (3.5n) it does
PARAMS = 12 * 256 + 256 + 256 * 256 + 256 + 256 * 4 + 4
CAP_GB = 0.001
RECIPE = '''
from meta.run.recipe import AtMost
FIXED = {"dataset": {"name": "arrays", "path": "blobs.npz", "test_fraction": 0.2,
                     "normalize": False},
         "model": {"name": "mlp", "hidden": [256, 256]}, "optimizer": "adam",
         "memory_limit_gb": %r}
MUTABLE = {"epochs": 1, "batch_size": 64, "lr": 0.01, "seed": 0, "distributed": "allreduce"}
METRICS = {"test_loss": AtMost(1e9)}
''' % CAP_GB


def _data(folder: Path, n: int = 800) -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    y = (x[:, :3].sum(1) > 0).astype(np.int64) + 2 * (x[:, 3] > 0)
    path = folder / "blobs.npz"
    np.savez(path, x=x, y=y)
    return str(path)


def test_the_check_uses_the_planner_s_memory_model():
    class Graph:  # what the check reads of a graph
        parameters = {"w": np.zeros(PARAMS, np.float32)}
        nodes = [object()] * 5

    n = 4 * PARAMS
    need = check_memory_budget("r", 1.0, "allreduce", {}, Graph, "adam", {}, 4)
    assert need == zero_memory(n, 2, 0.0, 4, 0) and need.total == 5 * n
    need = check_memory_budget("r", 1.0, "zero3", {}, Graph, "adam", {}, 4)
    assert need.total == zero_memory(n, 2, 0.0, 4, 3, 2).model_state == 2.5 * n
    assert check_memory_budget("r", 0.0, "allreduce", {}, Graph, "adam", {}, 4) is None
    with pytest.raises(MemoryBudgetError, match="needs 1.3 MB .* over memory_limit_gb 0.001"):
        check_memory_budget("r", CAP_GB, "allreduce", {}, Graph, "adam", {}, 4)
    with pytest.raises(MemoryBudgetError, match="splits the model"):
        check_memory_budget("r", CAP_GB, "pipeline", {}, Graph, "adam", {}, 4)
    # plain SGD keeps no state: its replica (3n) fits where Adam's does not
    assert check_memory_budget("r", CAP_GB, "allreduce", {}, Graph, "sgd", {}, 4).total == 3 * n


def test_a_run_over_its_budget_is_refused_before_training(tmp_path):
    recipe = make_recipe("budget", {
        "dataset": {"name": "arrays", "path": _data(tmp_path), "test_fraction": 0.2,
                    "normalize": False},
        "model": {"name": "mlp", "hidden": [256, 256]}, "optimizer": "adam",
        "memory_limit_gb": CAP_GB}, {"epochs": 1, "batch_size": 64, "seed": 0},
        {"test_loss": AtMost(1e9)})
    stream = io.StringIO()
    with pytest.raises(RecipeError) as err:
        run_recipe(recipe, SingleProcessCommunicator(), stream=stream, progress=False,
                   export_onnx=False, output_dir=tmp_path / "out")
    text = str(err.value)
    assert "\n" not in text and "distributed 'allreduce' at 1 rank(s) needs 1.3 MB" in text
    assert "optimizer state 0.5, buffers 0.3) per rank" in text
    assert "memory_limit_gb 0.001 (1.0 MB)" in text
    assert "under --set distributed=zero3 it fits at mpiexec -n 2" in text
    assert "epoch" not in stream.getvalue()  # no step was taken


def test_meta_run_over_the_budget_is_one_line_and_exit_2(tmp_path):
    _data(tmp_path)
    (tmp_path / "budget.py").write_text(RECIPE)
    done = subprocess.run([META, "run", "budget.py", "--quiet", "--no-export"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "memory_limit_gb 0.001" in err[0] and "needs" in err[0], err
    assert "--set distributed=zero3" in err[0]


@pytest.mark.slow
@pytest.mark.mpi
def test_at_4_ranks_refused_unsharded_and_trained_under_zero3(tmp_path, mpirun):
    _data(tmp_path)
    (tmp_path / "budget.py").write_text(RECIPE)
    args = [META, "run", str(tmp_path / "budget.py"), "--quiet", "--no-export"]
    out = mpirun(4, [*args, "--output-dir", str(tmp_path / "a")], expect_rc=2, timeout=240)
    assert "distributed 'allreduce' at 4 rank(s) needs 1.3 MB" in out, out
    assert "--set distributed=zero3 needs 0.7 MB per rank at 4 rank(s)" in out, out
    out = mpirun(4, [*args, "--output-dir", str(tmp_path / "z"), "--set",
                     "distributed=zero3"], timeout=240)
    assert "budget: PASS" in out, out


def test_the_large_gpt_recipe_is_refused_unsharded_and_fits_under_zero3(tmp_path,
                                                                          tinyshakespeare_dir):
    """recipes/shakespeare_gpt_large.py (8 blocks of width 512, AdamW, 0.25 GB a rank): only
    loaded and checked here, not trained (a full epoch is hours on two cores)."""
    from meta.planner.workload import build_network
    from meta.run.recipe import load_recipe

    recipe = load_recipe("recipes/shakespeare_gpt_large.py")
    graph, _train = build_network(recipe)
    assert sum(p.size for p in graph.parameters.values()) > 25_000_000
    opt = recipe.definitions.choices["optimizer"]

    def need(strategy: str, ranks: int) -> float:
        return check_memory_budget("large", recipe.definitions.memory_limit_gb, strategy, {},
                                   graph, opt.name, opt.values(), ranks).total

    assert need("zero3", 4) < 0.25 * (1 << 30) and need("zero3", 2) < 0.25 * (1 << 30)
    for strategy, ranks in (("allreduce", 4), ("zero2", 4), ("zero3", 1)):
        with pytest.raises(MemoryBudgetError, match="over memory_limit_gb 0.25"):
            need(strategy, ranks)
    done = subprocess.run([META, "run", "recipes/shakespeare_gpt_large.py", "--set",
                           "distributed=allreduce", "--quiet", "--no-export", "--output-dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "distributed 'allreduce' at 1 rank(s) needs 482 MB" in err[0]
    assert "(256 MB); under --set distributed=zero3 it fits at mpiexec -n 2" in err[0], err
