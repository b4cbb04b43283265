"""Ordinary mistakes end ``meta run`` with one line naming the problem and exit 2, never a
traceback: corrupt data files, labels outside the classes, a user op under a built-in name."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from meta.cli import EXIT_ERROR, main
from meta.lv2.datasets import clear_cache
from meta.lv2.idx import write_idx

RECIPE = """
    from meta.recipe import AtLeast
    {prelude}
    FIXED = {{"dataset": "mnist", "hidden": [8]}}
    MUTABLE = {{"epochs": 1, "batch_size": 16}}
    METRICS = {{"test_accuracy": AtLeast(0.0)}}
"""


def _recipe(tmp_path: Path, prelude: str = "") -> str:
    path = tmp_path / "tiny.py"
    path.write_text(textwrap.dedent(RECIPE.format(prelude=prelude)))
    return str(path)


@pytest.fixture
def raw_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of tiny uncompressed MNIST files (raw files have no md5 to check)."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "mnist"
    folder.mkdir()
    for prefix, n in (("train", 48), ("t10k", 16)):
        write_idx(folder / f"{prefix}-images-idx3-ubyte",
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", np.arange(n, dtype=np.uint8) % 10)
    monkeypatch.setenv("META_MNIST_DIR", str(folder))
    clear_cache()
    yield folder
    clear_cache()


def _one_line_error(capsys: pytest.CaptureFixture, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("meta: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err


def test_the_tiny_raw_dataset_trains(tmp_path: Path, raw_mnist: Path, capsys) -> None:
    assert main(["run", _recipe(tmp_path), "--output-dir", str(tmp_path / "out"), "--quiet",
                 "--no-export"]) == 0


def test_a_truncated_raw_file_exits_2_naming_it(tmp_path: Path, raw_mnist: Path,
                                               capsys) -> None:
    path = raw_mnist / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    assert main(["run", _recipe(tmp_path), "--output-dir", str(tmp_path / "out"),
                 "--quiet"]) == EXIT_ERROR
    _one_line_error(capsys, str(path), "truncated payload")
    assert not (tmp_path / "out").exists()


def test_labels_outside_the_classes_exit_2_naming_the_file(tmp_path: Path, raw_mnist: Path,
                                                          capsys) -> None:
    path = raw_mnist / "t10k-labels-idx1-ubyte"
    write_idx(path, np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5], np.uint8))
    assert main(["run", _recipe(tmp_path), "--output-dir", str(tmp_path / "out"),
                 "--quiet"]) == EXIT_ERROR
    _one_line_error(capsys, str(path), "label 10 at index 10", "0..9")


def test_a_recipe_registering_a_builtin_name_exits_2(tmp_path: Path, capsys) -> None:
    prelude = ("from meta import Operator, register\n"
               "    @register('Relu', since=14)\n"
               "    class Relu(Operator):\n"
               "        pass\n")
    assert main(["run", _recipe(tmp_path, prelude), "--quiet"]) == EXIT_ERROR
    _one_line_error(capsys, "'Relu'", "is built in", "domain of your own")
    from meta.lv0 import lookup
    from ops.relu import Relu

    assert lookup("Relu", 21) is Relu
