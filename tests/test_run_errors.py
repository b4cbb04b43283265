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
    from meta.run.recipe import AtLeast
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
    from meta.run.recipe import AtLeast
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


# -- issue 28: one boundary for user code, outputs first, checks before training ---------------
def _write(tmp_path: Path, body: str, name: str = "user") -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


USER = """
    import numpy as np
    from meta.run.recipe import AtLeast
    {prelude}
    FIXED = {{"dataset": {dataset}, "model": {model}{fixed}}}
    MUTABLE = {{"epochs": 2, "batch_size": 16, "lr": 0.1}}
    METRICS = {{{metrics}}}
"""
SYNTH = '{"name": "synthetic", "train_examples": 64, "test_examples": 32, "input_shape": [8]}'


def _user(tmp_path: Path, prelude: str = "", dataset: str = SYNTH,
          model: str = '{"name": "mlp", "hidden": [8]}', fixed: str = "",
          metrics: str = '"test_accuracy": AtLeast(0.0)') -> str:
    return _write(tmp_path, textwrap.dedent(USER).format(
        prelude=textwrap.dedent(prelude), dataset=dataset, model=model, fixed=fixed,
        metrics=metrics))


def _run(tmp_path: Path, recipe: str, *extra: str) -> int:
    return main(["run", recipe, "--output-dir", str(tmp_path / "out"), "--quiet", *extra])


def test_a_recipes_dataset_function_that_raises_is_one_line(tmp_path: Path, capsys) -> None:
    prelude = """
    from meta.lv2 import register_dataset

    @register_dataset("broken_data_28")
    def broken(seed):
        raise OSError("the share is not mounted")
    """
    assert _run(tmp_path, _user(tmp_path, prelude, dataset='"broken_data_28"')) == EXIT_ERROR
    err = _one_line_error(capsys, "dataset 'broken_data_28' (dataset) raised OSError while "
                          "loading the data: the share is not mounted",
                          f"traceback in {tmp_path / 'out' / 'error.log'}")
    assert "Traceback" in (tmp_path / "out" / "error.log").read_text(), err


def test_an_event_that_raises_names_event_hook_and_step(tmp_path: Path, capsys) -> None:
    prelude = """
    from meta.lv2 import Event

    class Boom(Event):
        def on_step_end(self, trainer, observation):
            if observation["step"] == 3:
                raise RuntimeError("no more")
    """
    recipe = _user(tmp_path, prelude, fixed=', "events": [Boom]')
    assert _run(tmp_path, recipe) == EXIT_ERROR
    _one_line_error(capsys, "event 'Boom' (events) raised RuntimeError in on_step_end at "
                    "epoch 1, step 3: no more")


def test_debug_prints_the_traceback(tmp_path: Path, capsys) -> None:
    prelude = """
    from meta.lv2 import Event

    class Boom(Event):
        def on_epoch_end(self, trainer, metrics):
            raise RuntimeError("no more")
    """
    assert _run(tmp_path, _user(tmp_path, prelude, fixed=', "events": [Boom]'),
                "--debug") == EXIT_ERROR
    err = capsys.readouterr().err
    assert "Traceback" in err and "in on_epoch_end" in err
    assert err.rstrip().splitlines()[-1].startswith("meta: error: event 'Boom'")


METRIC = """
    from meta.lv2 import Metric, register_metric

    @register_metric("{name}")
    class Custom(Metric):
        def compute(self, trainer, history):
            {body}
"""


@pytest.mark.parametrize("body,shown", [
    ('raise ZeroDivisionError("division by zero")', "raised ZeroDivisionError after training: "
     "division by zero"),
    ('return "high"', "raised TypeError after training: compute() returned str 'high', not a "
     "number"),
], ids=["raises", "string"])
def test_a_metric_that_fails_after_training_keeps_the_outputs(tmp_path: Path, capsys, body,
                                                              shown) -> None:
    import json

    name = f"custom_{abs(hash(body)) % 10**6}"
    recipe = _user(tmp_path, METRIC.format(name=name, body=body),
                   metrics=f'"test_accuracy": AtLeast(0.0), "{name}": AtLeast(0.0)')
    assert _run(tmp_path, recipe) == EXIT_ERROR
    _one_line_error(capsys, f"metric '{name}' (METRICS['{name}']) {shown}")
    out = tmp_path / "out"
    report = json.loads((out / "metrics.json").read_text())
    assert (out / "model.onnx").is_file() and (out / "checkpoint.npz").is_file()
    assert report["passed"] is False and name in report["not_measured"]
    assert report["metrics"]["test_accuracy"] >= 0.0


STRATEGY = """
    from meta.lv3 import Strategy, register_strategy

    @register_strategy("{name}")
    class Custom(Strategy):
        name = "{name}"

        def step(self, grads):
            {step}
"""


def test_a_strategy_without_predict_comm_s_keeps_the_outputs(tmp_path: Path, capsys) -> None:
    prelude = STRATEGY.format(name="plain28", step="self.optimizer.step(grads)")
    recipe = _user(tmp_path, prelude, fixed=', "distributed": "plain28"')
    assert _run(tmp_path, recipe) == 0
    out = capsys.readouterr().out
    assert "meta: warning: no communication report: NotImplementedError in distributed " \
        "'plain28': Custom.predict_comm_s" in out
    assert (tmp_path / "out" / "model.onnx").is_file()
    assert (tmp_path / "out" / "metrics.json").is_file()


def test_a_strategy_that_updates_nothing_is_warned_about(tmp_path: Path, capsys) -> None:
    prelude = STRATEGY.format(name="lazy28", step="pass")
    recipe = _user(tmp_path, prelude, fixed=', "distributed": "lazy28"')
    assert _run(tmp_path, recipe) == 0
    out = capsys.readouterr().out
    warned = [line for line in out.splitlines() if "training did nothing" in line]
    assert warned == ["meta: warning: training did nothing: none of the 4 parameter tensors "
                      "moved in 8 step(s) (does the strategy's step update them? is the "
                      "learning rate 0?)"], out


def test_a_training_that_moves_its_parameters_is_not_warned_about(tmp_path: Path,
                                                                  capsys) -> None:
    assert _run(tmp_path, _user(tmp_path)) == 0
    assert "warning" not in capsys.readouterr().out


def test_a_model_with_no_trainable_parameter_is_refused(tmp_path: Path, capsys) -> None:
    recipe = _user(tmp_path, model='{"name": "mlp", "hidden": [8], "frozen": ["*"]}')
    assert _run(tmp_path, recipe) == EXIT_ERROR
    _one_line_error(capsys, "model 'mlp' has no trainable parameter (4 frozen")


def _onnx_model(path: Path, batch: int | str, features: int, classes: int,
                reshape: bool = False) -> str:
    """A one-layer network as an ONNX file, its batch dimension ``batch``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((features, classes)).astype(np.float32),
                                "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"])]
    inits = [w]
    if reshape:  # a shape baked in by the export: the batch cannot be freed
        inits.append(numpy_helper.from_array(np.array([batch, features], np.int64), "shape"))
        nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]),
                 helper.make_node("MatMul", ["flat", "w"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def test_a_fixed_batch_dimension_is_freed(tmp_path: Path, capsys) -> None:
    model = _onnx_model(tmp_path / "m.onnx", 1, 8, 10)
    assert _run(tmp_path, _user(tmp_path, model=f'{{"name": "onnx", "path": "{model}"}}')) == 0
    assert "meta: model 'onnx' input 'x': batch dimension 1 freed ([1, 8] -> [N, 8])" in \
        capsys.readouterr().out


def test_a_batch_dimension_that_cannot_be_freed_is_refused(tmp_path: Path, capsys) -> None:
    model = _onnx_model(tmp_path / "m.onnx", 1, 8, 10, reshape=True)
    assert _run(tmp_path, _user(tmp_path, model=f'{{"name": "onnx", "path": "{model}"}}')) \
        == EXIT_ERROR
    _one_line_error(capsys, "model 'onnx' input 'x' has its batch dimension fixed: [1, 8]",
                    "batches are 16 examples", "dynamic_axes")


def test_logits_fewer_than_the_classes_name_both_sides(tmp_path: Path, capsys) -> None:
    model = _onnx_model(tmp_path / "m.onnx", "N", 8, 5)
    assert _run(tmp_path, _user(tmp_path, model=f'{{"name": "onnx", "path": "{model}"}}')) \
        == EXIT_ERROR
    _one_line_error(capsys, "model 'onnx' logits 'logits' give 5 classes ([N, 5]), dataset "
                    "'synthetic' has labels 0..9 (10 classes)")


def test_an_input_shape_that_does_not_match_the_examples(tmp_path: Path, capsys) -> None:
    model = _onnx_model(tmp_path / "m.onnx", "N", 6, 5)
    assert _run(tmp_path, _user(tmp_path, model=f'{{"name": "onnx", "path": "{model}"}}')) \
        == EXIT_ERROR
    _one_line_error(capsys, "input 'x' takes ['N', 6], the dataset's examples are [8]")


def _npz(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = tmp_path / "data.npz"
    np.savez(path, **arrays)
    return f'{{"name": "arrays", "path": "{path}"}}'


def test_an_npz_with_more_inputs_than_labels_is_one_line(tmp_path: Path, capsys) -> None:
    data = _npz(tmp_path, x=np.zeros((400, 8), np.float32), y=np.zeros(350, np.int64))
    assert _run(tmp_path, _user(tmp_path, dataset=data)) == EXIT_ERROR
    _one_line_error(capsys, "'x' has 400 examples, 'y' 350 labels; they must be as many")


def test_fractional_float_labels_are_refused(tmp_path: Path, capsys) -> None:
    labels = np.arange(40, dtype=np.float32) % 4
    labels[7] = 2.5
    data = _npz(tmp_path, x=np.zeros((40, 8), np.float32), y=labels)
    assert _run(tmp_path, _user(tmp_path, dataset=data)) == EXIT_ERROR
    _one_line_error(capsys, "'y' holds 2.5 at index 7 (1 label(s) not whole numbers)")


def test_an_empty_class_folder_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    from PIL import Image

    root = tmp_path / "images"
    for name, count in (("cat", 6), ("dog", 0), ("eel", 6)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((4, 4), 40 * i, np.uint8)).save(root / name / f"{i}.png")
    recipe = _user(tmp_path, dataset=f'{{"name": "image_folder", "path": "{root}"}}')
    assert _run(tmp_path, recipe) == EXIT_ERROR
    _one_line_error(capsys, f"class folder {root / 'dog'} has no images")


def test_set_without_a_value_exits_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _run(tmp_path, _user(tmp_path), "--set", "lr")
    assert info.value.code == EXIT_ERROR
    _one_line_error(capsys, "--set expects KEY=VALUE, got 'lr'")


def test_a_negative_checkpoint_every_exits_2(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _run(tmp_path, _user(tmp_path), "--checkpoint-every", "-5")
    assert info.value.code == EXIT_ERROR
    _one_line_error(capsys, "--checkpoint-every: expected a whole number >= 0, got -5")


def test_meta_run_on_a_directory_says_so(tmp_path: Path, capsys) -> None:
    assert main(["run", str(tmp_path)]) == EXIT_ERROR
    _one_line_error(capsys, f"recipe '{tmp_path}' is a directory")


@pytest.mark.parametrize("content,shown", [
    (b"\x08\x01\x12\x00\x00binary", "is not a recipe"),
    (b"import sys\nsys.exit(0)\n", "called sys.exit(0) while loading"),
], ids=["binary", "sys-exit"])
def test_a_file_that_is_not_a_recipe_is_one_line(tmp_path: Path, capsys, content,
                                                 shown) -> None:
    path = tmp_path / "notarecipe.py"
    path.write_bytes(content)
    assert main(["run", str(path)]) == EXIT_ERROR
    _one_line_error(capsys, shown)


def test_a_model_file_given_as_the_recipe_is_one_line(tmp_path: Path, capsys) -> None:
    model = _onnx_model(tmp_path / "m.onnx", "N", 8, 10)
    assert main(["run", model]) == EXIT_ERROR
    _one_line_error(capsys, "is not a recipe", "this file is not .py")


def test_a_corrupt_lock_file_is_an_error_naming_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.lock").write_text("{garbage")
    assert _run(tmp_path, _user(tmp_path)) == EXIT_ERROR
    _one_line_error(capsys, f"lock file {out / 'run.lock'} is not a lock meta wrote",
                    f"delete {out / 'run.lock'}")


def _finished(tmp_path: Path) -> tuple[str, Path]:
    recipe = _user(tmp_path)
    assert _run(tmp_path, recipe, "--no-export") == 0
    return recipe, tmp_path / "out"


def test_resume_with_fewer_epochs_than_done_exits_2(tmp_path: Path, capsys) -> None:
    recipe, out = _finished(tmp_path)
    capsys.readouterr()
    assert _run(tmp_path, recipe, "--resume", "--set", "epochs=1") == EXIT_ERROR
    _one_line_error(capsys, f"{out / 'checkpoint.npz'} has 2 epoch(s) done and epochs is 1",
                    "--set epochs=3")


def test_a_checkpoint_whose_parameter_changed_dtype_exits_2(tmp_path: Path, capsys) -> None:
    recipe, out = _finished(tmp_path)

    def widen(document, arrays):
        arrays["param.0"] = arrays["param.0"].astype(np.float64)

    _edit_checkpoint(out / "checkpoint.npz", widen)
    capsys.readouterr()
    assert _run(tmp_path, recipe, "--resume", "--set", "epochs=3") == EXIT_ERROR
    _one_line_error(capsys, "is float64 in the checkpoint, float32 in the network")


def test_a_failed_resume_keeps_the_finished_runs_metrics(tmp_path: Path, capsys,
                                                         monkeypatch) -> None:
    """A --resume that fails on a full disk: the finished run's metrics.json is moved aside
    (metrics.previous.json), never deleted."""
    import errno

    from meta.common.files import OutputError
    from meta.lv2 import checkpoint

    recipe, out = _finished(tmp_path)
    before = (out / "metrics.json").read_text()

    def full(path, ckpt):
        raise OutputError(path, OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(checkpoint, "save_checkpoint", full)
    capsys.readouterr()
    assert _run(tmp_path, recipe, "--resume", "--set", "epochs=3") == EXIT_ERROR
    _one_line_error(capsys, "No space left on device")
    assert (out / "metrics.previous.json").read_text() == before


@pytest.mark.parametrize("name,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_stops_at_a_step_checkpoints_releases_the_lock_and_exits_128_plus_it(
        tmp_path: Path, capsys, name, code) -> None:
    prelude = f"""
    import os, signal
    from meta.lv2 import Event

    class Term(Event):
        def on_step_end(self, trainer, observation):
            if observation["step"] == 3:
                os.kill(os.getpid(), signal.{name})
    """
    recipe = _user(tmp_path, prelude, fixed=', "events": [Term]')
    assert _run(tmp_path, recipe) == code
    out = tmp_path / "out"
    err = capsys.readouterr().err
    assert err == (f"meta: interrupted by {name} at epoch 1, step 3; checkpoint written to "
                   f"{out / 'checkpoint.npz'} (continue with --resume)\n"), err
    assert not (out / "run.lock").exists()
    from meta.lv2 import load_checkpoint

    assert load_checkpoint(out / "checkpoint.npz").position["step"] == 3


def test_check_op_on_a_module_that_raises_at_import_is_one_line(tmp_path: Path,
                                                               capsys) -> None:
    module = tmp_path / "ops_raise.py"
    module.write_text("raise RuntimeError('half-written module')\n")
    assert main(["check-op", "Relu", "--module", str(module)]) == EXIT_ERROR
    _one_line_error(capsys, f"--module {module} raised RuntimeError on import: "
                    "half-written module")


@pytest.mark.parametrize("edit,shown", [
    (lambda rec: rec.update(order=[1, 99]), "update 1 in 'order' names worker 99"),
    (lambda rec: rec.pop("order"), "field 'order' should be a list, it is missing"),
], ids=["worker-99", "no-order"])
def test_replay_on_an_edited_replay_json_is_one_line(tmp_path: Path, capsys, edit,
                                                     shown) -> None:
    import json

    rec = {"format": 1, "strategy": "async_parameter_server", "resumed": False,
           "recipe_file": str(tmp_path / "r.py"), "mutable": {}, "definitions": {},
           "threads": 1, "ranks": 2, "workers": [1], "order": [1, 1], "final_sha256": {}}
    edit(rec)
    (tmp_path / "replay.json").write_text(json.dumps(rec))
    assert main(["replay", str(tmp_path)]) == EXIT_ERROR
    _one_line_error(capsys, str(tmp_path / "replay.json"), shown)


def test_as_many_servers_as_ranks_is_refused_before_the_data_is_loaded(tmp_path: Path) -> None:
    """Downpour with 2 servers on 2 ranks: refused by the strategy's declared options, before
    the dataset function runs (a fake 2-rank communicator: nothing collective happens)."""
    import types

    from meta.run.recipe import RecipeError, load_recipe
    from meta.run.runner import RecipeRun

    prelude = """
    from meta.lv2 import register_dataset
    @register_dataset("counted_data_28")
    def counted(seed):
        raise AssertionError("the data was loaded")
    """
    recipe = load_recipe(_user(tmp_path, prelude, dataset='"counted_data_28"',
                               fixed=', "distributed": {"name": "downpour", "servers": 2}'))
    comm = types.SimpleNamespace(rank=0, size=2, is_root=True)
    with pytest.raises(RecipeError) as info:
        RecipeRun(recipe, comm, output_dir=tmp_path / "out")
    assert str(info.value) == ("recipe 'user': distributed 'downpour': servers=2 leaves no "
                               "rank to train among the job's 2 (mpiexec -n 2); run with at "
                               "least 3 ranks or set fewer servers")


def test_a_loss_that_never_changed_is_warned_about() -> None:
    """NothingLearned's verdict: parameters that never moved, a loss that never changed."""
    import types

    from meta.run.runner import NothingLearned

    params = {"w": np.ones(3, np.float32)}
    trainer = types.SimpleNamespace(executor=types.SimpleNamespace(
        graph=types.SimpleNamespace(parameters=params)))
    check = NothingLearned()
    check.on_train_begin(trainer)
    for step in range(1, 5):
        check.on_step_end(trainer, {"step": step, "loss": 2.302585})
    check.on_train_end(trainer)
    assert check.verdict() == [
        "training did nothing: none of the 1 parameter tensors moved in 4 step(s) (does the "
        "strategy's step update them? is the learning rate 0?)",
        "the training loss never changed in 4 steps (2.30259 at every step)"]
    moved = NothingLearned()
    moved.on_train_begin(trainer)
    params["w"] += 1
    moved.on_step_end(trainer, {"step": 1, "loss": 1.0})
    moved.on_step_end(trainer, {"step": 2, "loss": 0.5})
    moved.on_train_end(trainer)
    assert moved.verdict() == []


FORWARD_RAISES = """
    import numpy as np
    from meta import Operator, register
    from meta.lv1 import mlp
    from meta.lv1.graph import Node

    @register("RaisingRelu28", domain="test.ops")
    class RaisingRelu(Operator):
        def forward(self, ctx, x):
            raise ArithmeticError("the user's kernel gave up")

        def backward(self, ctx, dy):
            return (dy,)

    def raising_mlp(input_shape, classes, seed, dtype):
        graph = mlp(hidden=[8], input_shape=input_shape, classes=classes, seed=seed, dtype=dtype)
        graph.replace("relu0", Node("RaisingRelu28", ["fc0"], ["relu0"], "relu0", "test.ops"))
        return graph
"""


def test_a_user_operator_that_raises_names_its_file_and_line(tmp_path: Path, capsys) -> None:
    """No component wraps an operator's forward: the innermost frame of the traceback that is
    not a library's lies in the recipe's folder, so it is the user's code."""
    from meta.lv0 import unregister

    try:
        assert _run(tmp_path, _user(tmp_path, FORWARD_RAISES, model="raising_mlp")) \
            == EXIT_ERROR
    finally:
        unregister("RaisingRelu28", domain="test.ops")
    _one_line_error(capsys, "user code at user.py:13 in forward() raised ArithmeticError: node "
                    "'relu0' (RaisingRelu28) failed on inputs (fc0: float32[16, 8]): the user's "
                    "kernel gave up; traceback in")


# -- found by the property suite (tests/test_properties.py) -------------------------------------
def test_an_npz_without_examples_is_one_line(tmp_path: Path, capsys) -> None:
    data = _npz(tmp_path, x=np.zeros((0, 8), np.float32), y=np.zeros(0, np.int64))
    assert _run(tmp_path, _user(tmp_path, dataset=data)) == EXIT_ERROR
    _one_line_error(capsys, "'x' holds no examples")


def test_an_argument_with_a_newline_stays_on_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _run(tmp_path, _user(tmp_path), "\n")
    assert info.value.code == EXIT_ERROR
    _one_line_error(capsys, "unrecognized arguments: \\n")


def test_a_checkpoint_position_of_the_wrong_type_exits_2(tmp_path: Path, capsys) -> None:
    recipe, out = _finished(tmp_path)

    def edit(document, arrays):
        document["position"]["epoch"] = "x"

    _edit_checkpoint(out / "checkpoint.npz", edit)
    capsys.readouterr()
    assert _run(tmp_path, recipe, "--resume", "--set", "epochs=3") == EXIT_ERROR
    _one_line_error(capsys, f"{out / 'checkpoint.npz'}: position.epoch do(es) not hold what a "
                    "checkpoint writes")
