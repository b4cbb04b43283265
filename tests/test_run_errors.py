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
    from meta.ops.relu import Relu

    assert lookup("Relu", 21) is Relu


# -- mistakes found at start or while training (issue 17, item 5) -----------------------------
SYNTHETIC = """
    from meta.recipe import AtLeast
    {prelude}
    FIXED = {{"dataset": {{"name": "synthetic", "train_examples": 64, "test_examples": 32,
                          "input_shape": [8]}}, "model": {model}}}
    MUTABLE = {{"epochs": 2, "batch_size": 16, "lr": 0.1}}
    METRICS = {{"test_accuracy": AtLeast(0.0)}}
"""


def _synthetic(tmp_path: Path, prelude: str = "", model: str = '{"name": "mlp", "hidden": [8]}'
               ) -> str:
    path = tmp_path / "synth.py"
    path.write_text(textwrap.dedent(SYNTHETIC).format(prelude=textwrap.dedent(prelude),
                                                      model=model))
    return str(path)


def test_set_lr_nan_exits_2_naming_the_key(tmp_path: Path, capsys) -> None:
    assert main(["run", _synthetic(tmp_path), "--set", "lr=nan", "--quiet"]) == EXIT_ERROR
    err = capsys.readouterr().err  # one problem: one line
    assert err == "meta: error: recipe 'synth' --set: option 'lr' must be a number, got nan\n"


def test_an_output_folder_that_is_a_file_exits_2(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.write_text("not a folder")
    assert main(["run", _synthetic(tmp_path), "--output-dir", str(out), "--quiet"]) == EXIT_ERROR
    _one_line_error(capsys, f"output folder {out} is a file", "--output-dir")
    assert main(["run", _synthetic(tmp_path), "--output-dir", str(out / "sub"),
                 "--quiet"]) == EXIT_ERROR
    _one_line_error(capsys, f"output folder {out / 'sub'} cannot be created: {out} is a file")
    assert out.read_text() == "not a folder"


def test_an_unwritable_output_folder_exits_2(tmp_path: Path, capsys,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    out = tmp_path / "out"
    out.mkdir()
    if os.geteuid() != 0:  # root writes anywhere: then the refusal is simulated
        out.chmod(0o555)
    else:
        real = os.open

        def refuse(path, *args, **kwargs):
            if str(path).startswith(str(out)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", refuse)
    try:
        assert main(["run", _synthetic(tmp_path), "--output-dir", str(out),
                     "--quiet"]) == EXIT_ERROR
    finally:
        out.chmod(0o755)
    _one_line_error(capsys, f"output folder {out} cannot be written (Permission denied)",
                    "choose another with --output-dir")


def _edit_checkpoint(path: Path, edit) -> None:
    """Rewrite the checkpoint's description (the JSON in __meta__) with ``edit`` applied."""
    import json

    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    document = json.loads(arrays["__meta__"].tobytes())
    edit(document, arrays)
    arrays["__meta__"] = np.frombuffer(json.dumps(document).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize("edit,field", [
    (lambda doc, arrays: doc["position"].pop("step"), "position.step"),
    (lambda doc, arrays: doc.pop("optimizer"), "optimizer"),
    (lambda doc, arrays: arrays.pop("param.0"), "array param.0"),
    (lambda doc, arrays: doc["optimizer"]["dict"].clear(), "optimizer state has no 'state'"),
], ids=["position", "section", "array", "optimizer-state"])
def test_a_checkpoint_missing_a_field_exits_2_naming_file_and_field(tmp_path: Path, capsys,
                                                                    edit, field) -> None:
    out = tmp_path / "out"
    args = ["run", _synthetic(tmp_path), "--output-dir", str(out), "--quiet", "--no-export"]
    assert main(args) == 0
    _edit_checkpoint(out / "checkpoint.npz", edit)
    capsys.readouterr()
    assert main([*args, "--resume", "--set", "epochs=3"]) == EXIT_ERROR
    _one_line_error(capsys, str(out / "checkpoint.npz"), field)


def test_a_loss_that_becomes_nan_exits_2_naming_step_checkpoint_and_lr(tmp_path: Path,
                                                                       capsys) -> None:
    out = tmp_path / "out"
    args = ["run", _synthetic(tmp_path), "--output-dir", str(out), "--quiet", "--set",
            "lr=1e30"]
    assert main(args) == EXIT_ERROR
    _one_line_error(capsys, "loss became nan at epoch 1, step 2", "learning rate 1e+30",
                    "no checkpoint was written")
    assert main([*args, "--checkpoint-every", "1"]) == EXIT_ERROR
    _one_line_error(capsys, "loss became nan at epoch 1, step 2", "learning rate 1e+30",
                    f"the last good checkpoint is {out / 'checkpoint.npz'} (epoch 1, step 1)")
    assert not (out / "metrics.json").exists() and not list(out.glob("*.tmp"))


BAD_BACKWARD = """
    import numpy as np
    from meta import Operator, register
    from meta.lv1 import mlp
    from meta.lv1.graph import Node

    @register("{op}", domain="test.ops")
    class Bad(Operator):
        def forward(self, ctx, x):
            return np.maximum(x, 0)

        def backward(self, ctx, dy):
            return {returned}

    def bad_mlp(input_shape, classes, seed, dtype):
        graph = mlp(hidden=[8], input_shape=input_shape, classes=classes, seed=seed, dtype=dtype)
        graph.replace("relu0", Node("{op}", ["fc0"], ["relu0"], "relu0", "test.ops"))
        return graph
"""


@pytest.mark.parametrize("returned,shown", [
    ("None", "returned None"),
    ("()", "returned ()"),
    ("(dy, dy)", "returned 2 value(s) (shape (16, 8), shape (16, 8))"),
    ("(dy[:1],)", "returned a gradient of shape (1, 8) for input 0 ('fc0') of shape (16, 8)"),
], ids=["None", "empty", "too-many", "wrong-shape"])
def test_a_custom_ops_bad_backward_exits_2_naming_it(tmp_path: Path, capsys, returned,
                                                     shown) -> None:
    from meta.lv0 import unregister

    op = f"BadRelu{abs(hash(returned))}"
    prelude = BAD_BACKWARD.format(op=op, returned=returned)
    try:
        assert main(["run", _synthetic(tmp_path, prelude, "bad_mlp"), "--quiet",
                     "--output-dir", str(tmp_path / "out")]) == EXIT_ERROR
    finally:
        unregister(op, domain="test.ops")
    _one_line_error(capsys, f"node 'relu0' ({op}): the backward of operator {op}", shown)
