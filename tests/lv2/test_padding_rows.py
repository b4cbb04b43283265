"""``padding_rows``: PyTorch's ``nn.Embedding(..., padding_idx=0)`` in a file that cannot say
it (issue 39, item 5). ``tests/fixtures/padding/padding_bert.onnx`` is a BERT-style classifier exported with
``torch.onnx.export``'s defaults; ``padding_bert.npz`` holds what PyTorch computed training it
for 20 steps on batches full of padding (``fixtures/make_padding_fixture.py``). With the option
meta's 20 steps match PyTorch's within 1e-5 (SGD with momentum: the row never moves; AdamW:
its decoupled weight decay still shrinks the row, as PyTorch's does); without it the row
trains."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv1 import EXECUTORS
from meta.lv1.onnx_model import onnx_model
from meta.lv2 import OPTIMIZERS, build_optimizer

from .fixtures import make_padding_fixture as maker

FIXTURES = Path(__file__).parents[1] / "fixtures" / "padding"
WORDS = "word_embeddings.weight"
TOLERANCE = 1e-5


def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "padding_bert.npz") as data:
        return {k: data[k] for k in data.files}


def train(run: str, executor: str, padding: bool) -> tuple[list[float], dict]:
    """meta's 20 steps of the fixture's run ``run``, the recipe's optimizer options."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = onnx_model((maker.CONTEXT,), maker.CLASSES, 0, np.float32,
                           str(FIXTURES / "padding_bert.onnx"))
    cls, options = maker.RUNS[run]
    options = {"lr": options["lr"], "momentum": options.get("momentum", 0.0),
               "weight_decay": options.get("weight_decay", 0.0)}
    if cls == "SGD":
        options["nesterov"] = False
    else:
        del options["momentum"]
    if padding:
        options["padding_rows"] = {WORDS: [0]}
    optimizer = build_optimizer(OPTIMIZERS[cls.lower()], options, graph.parameters, 20, 1)
    ref = reference()
    session = EXECUTORS[executor](graph).train()
    losses = []
    for step in range(maker.STEPS):
        values, grads = session.inference_and_backprop(
            {"input": ref["ids"][step], "labels": ref["labels"][step]})
        losses.append(float(values["loss"]))
        optimizer.step(grads)
    return losses, graph.initializers


@pytest.mark.parametrize("executor", ["reference", "planned"])
@pytest.mark.parametrize("run", list(maker.RUNS))
def test_padding_rows_train_as_pytorch(run, executor):
    ref = reference()
    losses, weights = train(run, executor, padding=True)
    np.testing.assert_allclose(losses, ref[f"{run}/losses"], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(weights[WORDS], ref[f"{run}/word_embeddings"], rtol=0,
                               atol=TOLERANCE)
    row, start = weights[WORDS][0], ref["initial_word_embeddings"][0]
    if run == "sgd":  # no weight decay: the padding row never moves
        np.testing.assert_array_equal(row, start)
    else:  # AdamW's decoupled decay alone: (1 - lr * wd) ** steps
        lr, wd = maker.RUNS[run][1]["lr"], maker.RUNS[run][1]["weight_decay"]
        np.testing.assert_allclose(row, start * (1 - lr * wd) ** maker.STEPS, rtol=1e-5)


def test_without_the_option_the_padding_row_trains():
    """What the option fixes: the file alone trains row 0 whenever token 0 occurs."""
    ref = reference()
    _, weights = train("sgd", "reference", padding=False)
    assert np.abs(weights[WORDS][0] - ref["initial_word_embeddings"][0]).max() > 1e-3
    assert np.abs(weights[WORDS] - ref["sgd/word_embeddings"]).max() > 1e-3


@pytest.mark.parametrize("rows, message", [
    ({"word_embedings.weight": [0]}, "'word_embedings.weight' is not a trainable parameter "
                                     "(did you mean 'word_embeddings.weight'?)"),
    ({WORDS: [30]}, "'word_embeddings.weight' has 30 rows [30, 16], rows [30] asked"),
    ({WORDS: "0"}, "takes row indices"),
    ([0], "must be dict"),
])
def test_bad_padding_rows_are_one_line(rows, message):
    params = {WORDS: np.zeros((30, 16), np.float32)}
    with pytest.raises(ComponentError, match="padding_rows") as err:
        build_optimizer(OPTIMIZERS["adamw"], {"padding_rows": rows}, params, 1, 1)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_int_names_one_row_and_clipping_sees_the_zeroed_gradient():
    params = {WORDS: np.ones((3, 2))}
    optimizer = build_optimizer(OPTIMIZERS["sgd"], {"lr": 1.0, "momentum": 0.0,
                                                    "grad_clip": 1.0, "padding_rows": {WORDS: 0}},
                                params, 1, 1)
    optimizer.step({WORDS: np.array([[100.0, 0.0], [0.6, 0.0], [0.8, 0.0]])})
    # row 0's 100 is gone before the norm is taken: rows 1, 2 (norm 1) are not scaled down
    np.testing.assert_allclose(params[WORDS][:, 0], [1.0, 0.4, 0.2])


def test_another_frameworks_optimizer_refuses_padding_rows():
    pytest.importorskip("torch")
    params = {WORDS: np.zeros((3, 2), np.float32)}
    with pytest.raises(ComponentError, match="padding_rows is applied by meta's own"):
        build_optimizer(OPTIMIZERS["torch_adamw"], {"padding_rows": {WORDS: [0]}}, params, 1, 1)


def test_meta_run_keeps_the_padding_row(tmp_path, capsys):
    """Through a recipe: ``padding_rows`` beside the optimizer's name, SGD with momentum and
    no weight decay, the trained model file's row 0 equal to the fixture's."""
    import onnx
    from onnx import numpy_helper

    from meta.cli import EXIT_PASS, main

    ref = reference()
    np.savez(tmp_path / "ids.npz", x=ref["ids"].reshape(-1, maker.CONTEXT),
             y=ref["labels"].reshape(-1))
    recipe = tmp_path / "padding.py"
    recipe.write_text(
        "from meta.run.recipe import AtLeast\n"
        f"FIXED = {{'dataset': {{'name': 'arrays', 'path': {str(tmp_path / 'ids.npz')!r}}},\n"
        f"         'model': {{'name': 'onnx', 'path': {str(FIXTURES / 'padding_bert.onnx')!r}}},\n"
        f"         'optimizer': {{'name': 'sgd', 'lr': 0.1, 'padding_rows': {{{WORDS!r}: 0}}}}}}\n"
        "MUTABLE = {'epochs': 2, 'batch_size': 8, 'seed': 0}\n"
        "METRICS = {'test_accuracy': AtLeast(0.0)}\n")
    out = tmp_path / "out"
    assert main(["run", str(recipe), "--output-dir", str(out), "--quiet"]) == EXIT_PASS
    saved = {t.name: numpy_helper.to_array(t)
             for t in onnx.load(str(out / "model.onnx")).graph.initializer}
    np.testing.assert_array_equal(saved[WORDS][0], ref["initial_word_embeddings"][0])
    assert np.abs(saved[WORDS][1:] - ref["initial_word_embeddings"][1:]).max() > 1e-3


def test_inspect_says_the_file_has_no_padding_index():
    """meta inspect names each embedding table and the option that keeps a padding row."""
    from meta.lv1 import from_onnx
    from meta.lv1.summary import summarize

    text = summarize(from_onnx(Path(__file__).parents[1] / "fixtures" / "padding"
                               / "padding_bert.onnx"))
    line = next(s for s in text.splitlines() if "padding index" in s)
    assert "word_embeddings.weight" in line and "padding_rows" in line
