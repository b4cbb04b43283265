"""Checks before training (meta.run.preflight): each problem names the model's side and the
data's, every problem in one message."""

from __future__ import annotations

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv1 import mlp
from meta.lv2 import ArrayDataset
from meta.run.preflight import check_model_and_data, check_ranks
from meta.run.recipe import registry


def _data(n: int = 8, features: int = 6, classes: int = 4) -> ArrayDataset:
    return ArrayDataset(np.zeros((n, features), np.float32), np.arange(n) % classes)


def test_a_fitting_model_passes_without_notes() -> None:
    graph = mlp(hidden=[4], input_shape=(6,), classes=4, seed=0)
    assert check_model_and_data("r", "mlp", "d", graph, _data(), _data(), 4,
                                {"input": "input", "logits": "logits"}) == []


def test_labels_the_loss_cannot_take_name_both_sides() -> None:
    graph = mlp(hidden=[4], input_shape=(6,), classes=4, seed=0)
    next(t for t in graph.inputs if t.name == "labels").dtype = np.dtype(np.float32)
    with pytest.raises(ComponentError) as info:
        check_model_and_data("r", "mlp", "d", graph, _data(), _data(), 4,
                             {"input": "input", "logits": "logits"})
    assert str(info.value) == ("model 'mlp' takes labels as float32, its loss as class indices; "
                               "dataset 'd' gives int64 class indices")


def test_every_problem_is_in_one_line() -> None:
    graph = mlp(hidden=[4], input_shape=(5,), classes=3, seed=0)
    graph.select([], ["*"])  # nothing trainable
    with pytest.raises(ComponentError) as info:
        check_model_and_data("r", "mlp", "d", graph, _data(), _data(), 4,
                             {"input": "input", "logits": "logits"})
    message = str(info.value)
    assert "\n" not in message and message.startswith(
        "model 'mlp' and dataset 'd' do not fit: 3 problems: (1) model 'mlp' input 'input' "
        "takes [N, 5], dataset 'd' gives batches of [N, 6]; (2) model 'mlp' logits 'logits' "
        "give 3 classes ([N, 3]), dataset 'd' has labels 0..3 (4 classes); (3) model 'mlp' "
        "has no trainable parameter"), message


@pytest.mark.parametrize("name,options,size,shown", [
    ("downpour", {"servers": 3}, 3, "servers=3 leaves no rank to train among the job's 3"),
    ("sandblaster", {"servers": 2}, 2, "servers=2 leaves no rank to train among the job's 2"),
    ("hybrid_downpour", {"stages": 3, "servers": 1}, 3,
     "stages=3 needs 3 ranks that train, the job has 2 (mpiexec -n 3 with 1 server(s))"),
], ids=["downpour", "sandblaster", "hybrid"])
def test_servers_and_stages_against_the_ranks(name, options, size, shown) -> None:
    component = registry("strategy")[name]
    with pytest.raises(ComponentError, match=r".*".join(map(__import__("re").escape,
                                                              [f"distributed {name!r}",
                                                               shown]))):
        check_ranks("r", component, component.resolve(options), size)
    check_ranks("r", component, component.resolve(options), size + 3)  # enough ranks
    check_ranks("r", component, component.resolve(options), 1)  # one process runs alone


def test_a_file_that_cannot_train_as_its_source_is_refused_until_the_user_chooses() -> None:
    """A train-mode BatchNorm CNN exported with torch.onnx.export's defaults: its BatchNorm is
    folded with the running statistics into the convolutions, so it cannot train as PyTorch
    did; the loader refuses it in one line naming the remedy (the same line on every path:
    from_onnx, a model function, the stock onnx model), unless the user opts in with
    as_exported=True, after which preflight lets it train as the file is."""
    import warnings
    from pathlib import Path

    from meta.lv1 import from_onnx
    from meta.lv1.onnx_io import ONNXLoadError

    path = Path(__file__).parent / "fixtures" / "pytorch" / "exports" / "bn_cnn_default.onnx"
    with pytest.raises(ONNXLoadError) as info:
        from_onnx(path)
    message = str(info.value)
    assert "\n" not in message and "cannot train as its source did: the model was exported " \
                                   "in train mode" in message
    assert "optimize=False" in message and "dynamic_shapes" in message
    assert "as_exported=True" in message
    with warnings.catch_warnings(record=True):
        graph = from_onnx(path, as_exported=True)  # the user's call
    data = ArrayDataset(np.zeros((8, 3, 8, 8), np.float32), np.arange(8) % 5)
    assert check_model_and_data("r", "cnn", "d", graph, data, data, 4,
                                {"input": "input", "logits": "logits"}) == []


def test_per_token_targets_are_checked_along_the_class_axis() -> None:
    """A language model's logits are (N, vocab, T): the classes are axis 1, not the last."""
    from meta.lv1 import gpt

    ids = np.arange(32).reshape(4, 8) % 5
    data = ArrayDataset(ids, (ids + 1) % 5)
    names = {"input": "input", "logits": "logits"}
    assert check_model_and_data("r", "gpt", "d", gpt((8,), 5, layers=1, heads=1, width=4), data,
                                data, 4, names) == []
    with pytest.raises(ComponentError, match=r"logits 'logits' give 3 classes \(\[N, 3, 8\]\), "
                                             r"dataset 'd' has labels 0..4 \(5 classes\)"):
        check_model_and_data("r", "gpt", "d", gpt((8,), 5, layers=1, heads=1, width=4,
                                                  vocab_size=3), data, data, 4, names)
