"""Deterministic replay: a 3-rank asynchronous parameter-server run (1 server, 2 workers)
records the order in which its server applied the updates; ``meta replay`` recomputes the run
on one process in that order and ends with bit-identical weights, and another order does not."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.launch import clean_env, find_mpiexec, run_command

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": {"name": "synthetic", "train_examples": 512, "test_examples": 64,
                         "input_shape": [16]},
             "hidden": [16], "distributed": "async_parameter_server"}
    MUTABLE = {"epochs": 2, "batch_size": 16, "lr": 0.05, "momentum": 0.9}
    METRICS = {"test_accuracy": AtLeast(0.5)}
"""
ENV = {"OMP_NUM_THREADS": "1"}


def meta(*args: str) -> list[str]:
    return [sys.executable, "-m", "meta.cli", *args]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("replay")
    recipe = folder / "async_ps.py"
    recipe.write_text(textwrap.dedent(RECIPE))
    out = folder / "out"
    run_command([str(find_mpiexec()), "-n", "3", *meta("run", str(recipe), "--quiet",
                                                       "--output-dir", str(out))],
                clean_env(ENV), timeout=120)
    return out


def test_the_server_records_the_order_of_its_updates(run_dir: Path) -> None:
    record = json.loads((run_dir / "replay.json").read_text())
    assert record["workers"] == [0, 1] and record["ranks"] == 3 and record["threads"] == 1
    assert len(record["order"]) == 2 * 2 * 16  # 2 workers, 2 epochs, 16 batches each
    assert sorted(set(record["order"])) == [0, 1]


def test_a_replay_ends_with_bit_identical_weights(run_dir: Path, tmp_path: Path) -> None:
    saved = tmp_path / "replayed.npz"
    out = run_command(meta("replay", str(run_dir), "--save", str(saved)), clean_env(),
                      timeout=120)
    assert "64 updates replayed" in out and "bit-identical to the run's" in out, out
    model = onnx.load(str(run_dir / "model.onnx"))
    exported = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    with np.load(saved) as replayed:
        assert set(replayed.files) <= set(exported)
        for name in replayed.files:
            assert replayed[name].tobytes() == exported[name].tobytes(), name


def test_another_order_gives_other_weights(run_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    record = json.loads((run_dir / "replay.json").read_text())
    order = record["order"]
    i = next(k for k in range(len(order) - 1) if order[k] != order[k + 1])
    order[i], order[i + 1] = order[i + 1], order[i]
    (other / "replay.json").write_text(json.dumps(record))
    out = run_command(meta("replay", str(other)), clean_env(), timeout=120, expect_rc=1)
    assert "final weights DIFFERENT from the run's" in out, out


def test_a_folder_without_an_update_order_exits_2(tmp_path: Path) -> None:
    out = run_command(meta("replay", str(tmp_path)), clean_env(), timeout=60, expect_rc=2)
    assert out.startswith(f"meta: error: {tmp_path / 'replay.json'} not found") and \
        "Traceback" not in out, out
