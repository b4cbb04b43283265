"""Token ids through the ``arrays`` dataset train a token model end to end through ``meta run``
(issue 39, item 7): int64 ids stay ids (never cast to float32, scaled or standardized);
per-position labels (N, T) train a stock ``onnx`` model whose logits are (N, V, T), the
per-token loss over axis 1 as PyTorch's cross_entropy computes it; (N, T, V) logits are one
line naming the remedy, exit 2."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from meta.cli import EXIT_ERROR, EXIT_PASS, main
from meta.lv1 import ReferenceExecutor
from meta.lv1.onnx_model import onnx_model
from meta.lv2.array_files import arrays

V, T, D = 8, 6, 12


def token_model(path: Path, head: str, classes: int = V, seed: int = 0) -> str:
    """A stock ONNX token model as an exporter writes one: ids (N, T) int64 -> Gather from an
    embedding -> MatMul + Add; ``head``: "nvt" transposes the scores to (N, V, T), "ntv"
    leaves them (N, T, V), "pool" averages the positions into (N, classes)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((V, D)) * 0.5).astype(np.float32),
                                     "embed.weight"),
             numpy_helper.from_array((rng.standard_normal((D, classes)) * 0.3).astype(
                 np.float32), "head.weight"),
             numpy_helper.from_array(np.zeros(classes, np.float32), "head.bias")]
    nodes = [helper.make_node("Gather", ["embed.weight", "ids"], ["h"])]
    if head == "pool":
        nodes += [helper.make_node("ReduceMean", ["h"], ["pooled"], axes=[1], keepdims=0),
                  helper.make_node("MatMul", ["pooled", "head.weight"], ["s"]),
                  helper.make_node("Add", ["s", "head.bias"], ["logits"])]
        out = ["N", classes]
    else:
        nodes += [helper.make_node("MatMul", ["h", "head.weight"], ["s"]),
                  helper.make_node("Add", ["s", "head.bias"],
                                   ["logits" if head == "ntv" else "scores"])]
        out = ["N", T, classes]
        if head == "nvt":
            nodes.append(helper.make_node("Transpose", ["scores"], ["logits"], perm=[0, 2, 1]))
            out = ["N", classes, T]
    graph = helper.make_graph(
        nodes, "tokens", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", T])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, out)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def next_token_data(path: Path, n: int = 240) -> str:
    """Ids (n, T) and their next tokens (n, T): a fixed successor table, learnable; the last
    position of every fourth example padded with -100 (PyTorch's ignore_index)."""
    rng = np.random.default_rng(1)
    successor = rng.permutation(V)
    x = rng.integers(0, V, (n, T)).astype(np.int64)
    y = successor[x]
    y[::4, -1] = -100
    np.savez(path, x=x, y=y)
    return str(path)


def recipe(tmp_path: Path, data: str, model: str, bound: float = 0.0) -> str:
    path = tmp_path / "tokens.py"
    path.write_text(textwrap.dedent(f"""
        from meta.run.recipe import AtLeast
        FIXED = {{"dataset": {{"name": "arrays", "path": {data!r}}},
                  "model": {{"name": "onnx", "path": {model!r}}}, "optimizer": "adam"}}
        MUTABLE = {{"epochs": 8, "batch_size": 16, "lr": 0.05, "seed": 0}}
        METRICS = {{"test_accuracy": AtLeast({bound})}}
    """))
    return str(path)


def run(tmp_path: Path, recipe_path: str) -> int:
    return main(["run", recipe_path, "--output-dir", str(tmp_path / "out"), "--quiet"])


def test_int64_ids_stay_ids_and_uint8_stay_pixels(tmp_path):
    ids = np.arange(40 * T, dtype=np.int64).reshape(40, T) % 300
    np.savez(tmp_path / "ids.npz", x=ids, y=np.arange(40) % 2)
    train, test = arrays(0, str(tmp_path / "ids.npz"), "", "", "", 0.25, True)
    assert train.inputs.dtype == np.int64 and test.inputs.dtype == np.int64
    assert set(np.unique(np.concatenate([train.inputs, test.inputs]))) == set(np.unique(ids))
    pixels = (ids % 256).astype(np.uint8)
    np.savez(tmp_path / "px.npz", x=pixels, y=np.arange(40) % 2)
    train, _ = arrays(0, str(tmp_path / "px.npz"), "", "", "", 0.25, False)
    assert train.inputs.dtype == np.float32 and train.inputs.max() <= 1.0
    # said explicitly: int64 pixels, uint8 ids
    train, _ = arrays(0, str(tmp_path / "ids.npz"), "", "", "", 0.25, False, "pixels")
    assert train.inputs.dtype == np.float32 and train.inputs.max() <= 300 / 255
    train, _ = arrays(0, str(tmp_path / "px.npz"), "", "", "", 0.25, True, "ids")
    assert train.inputs.dtype == np.int64


def test_int64_token_ids_train_a_token_classifier(tmp_path, capsys):
    rng = np.random.default_rng(2)
    x = rng.integers(0, V, (320, T)).astype(np.int64)
    np.savez(tmp_path / "cls.npz", x=x, y=(x == 0).any(1).astype(np.int64))
    model = token_model(tmp_path / "pool.onnx", "pool", classes=2)
    assert run(tmp_path, recipe(tmp_path, str(tmp_path / "cls.npz"), model, 0.9)) == EXIT_PASS


def test_nvt_logits_train_per_token_through_meta_run(tmp_path, capsys):
    model = token_model(tmp_path / "nvt.onnx", "nvt")
    data = next_token_data(tmp_path / "lm.npz")
    assert run(tmp_path, recipe(tmp_path, data, model, 0.95)) == EXIT_PASS


def test_nvt_loss_is_pytorchs_cross_entropy(tmp_path):
    """The loss meta adds to (N, V, T) logits: per token over axis 1, padding skipped, the
    mean over the real tokens (torch.nn.functional.cross_entropy's defaults)."""
    graph = onnx_model((T,), V, 0, np.float32, token_model(tmp_path / "nvt.onnx", "nvt"))
    with np.load(next_token_data(tmp_path / "lm.npz")) as data:
        x, y = data["x"][:8], data["y"][:8]
    values = ReferenceExecutor(graph).inference({"ids": x, "labels": y}, ["logits", "loss"])
    logits = values["logits"].astype(np.float64)
    assert logits.shape == (8, V, T)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    kept = y != -100
    picked = np.take_along_axis(logp, np.where(kept, y, 0)[:, None], 1)[:, 0]
    expected = -picked[kept].mean()
    assert float(values["loss"]) == pytest.approx(expected, rel=1e-5)
    torch = pytest.importorskip("torch")
    theirs = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(y))
    assert float(values["loss"]) == pytest.approx(float(theirs), rel=1e-5)


def test_ntv_logits_are_one_line_naming_the_transpose(tmp_path, capsys):
    model = token_model(tmp_path / "ntv.onnx", "ntv")
    assert run(tmp_path, recipe(tmp_path, next_token_data(tmp_path / "lm.npz"), model)) \
        == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("meta: error: ") and err.count("\n") == 1, err
    assert "(N, T, C) with the classes last" in err and "transpose(1, 2)" in err, err


def test_per_example_logits_with_per_position_labels_are_one_line(tmp_path, capsys):
    model = token_model(tmp_path / "pool.onnx", "pool")
    assert run(tmp_path, recipe(tmp_path, next_token_data(tmp_path / "lm.npz"), model)) \
        == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("meta: error: ") and err.count("\n") == 1, err
    assert "per-position labels [N, 6]" in err, err


def test_per_position_labels_must_match_the_examples(tmp_path, capsys):
    np.savez(tmp_path / "bad.npz", x=np.zeros((40, T), np.int64), y=np.zeros((40, T + 1)))
    model = token_model(tmp_path / "nvt.onnx", "nvt")
    assert run(tmp_path, recipe(tmp_path, str(tmp_path / "bad.npz"), model)) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one per position" in err, err
