"""What ``torch.onnx.export(model, args)``'s optimizer does that meta must undo or refuse.

Fixtures in ``tests/fixtures/pytorch/exports`` (``make_export_fixtures.py``; PyTorch not needed
here): ``vit_static.onnx`` (the defaults with nothing but names: a fixed batch of 4, so the class
token's ``expand`` is folded into a (4, 1, 8) initializer), ``{resnet,mobilenet}_eval_default``
(eval mode: BatchNorm folded into the convolutions), ``bn_cnn_default`` (train mode, the same
folding), ``encoder_*`` (``nn.TransformerEncoder``: two deep-copied layers, equal at export).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

from meta.lv1 import EXECUTORS, from_onnx
from meta.lv1.onnx_io import AS_EXPORTED, ONNXLoadError

from .test_default_exports import TOLERANCE, info, quiet_load, train
from .test_pytorch_training import EXECUTOR_NAMES, FIXTURES, reference

EXPORTS = FIXTURES / "exports"


def quiet(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_onnx(path, **kw)


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
def test_a_folded_class_token_expand_trains_as_one_parameter(executor):
    """Issue 39 item 3: cls (1, 1, 8) is one parameter broadcast to the batch, not four
    copies; 20 SGD steps within 1e-5 of PyTorch (the same initial ViT as ``vit_*``)."""
    graph = quiet_load("vit", "static")
    assert graph.parameters["cls"].shape == (1, 1, 8)
    assert "expand" not in graph.initializers
    node = graph.node("expand/expand")
    assert node.op_type == "Expand" and node.inputs[0] == "cls" and node.outputs == ["expand"]
    assert any(n.startswith("restored expand = Expand(cls, [4, 1, 8])") for n in graph.notes)
    assert sum(v.size for v in graph.parameters.values()) == \
        sum(int(np.prod(s)) for s in info("vit")["torch_parameters"].values())
    ref = reference("exports/vit")
    losses = train(graph, ref, executor)
    np.testing.assert_allclose(losses, ref["losses"], rtol=0, atol=TOLERANCE)
    for name in ("cls", "pos", "patch.weight", "head.weight", "encoder.norm2.weight"):
        np.testing.assert_allclose(graph.initializers[name], ref[f"final/{name}"], rtol=0,
                                   atol=TOLERANCE, err_msg=name)


def test_a_broadcast_of_one_repeated_number_is_still_a_parameter():
    """A zero-initialized class token folded by the exporter holds one number: its values are
    nowhere else in the file, so it trains (the batch axis taken as the broadcast one)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(EXPORTS / "vit_static.onnx"))
    t = next(t for t in model.graph.initializer if t.name == "expand")
    t.CopyFrom(numpy_helper.from_array(np.zeros((4, 1, 8), np.float32), "expand"))
    graph = quiet(model)
    assert graph.parameters["cls"].shape == (1, 1, 8)
    assert any("the batch axis is taken as broadcast" in n for n in graph.notes)


@pytest.mark.parametrize("net", ["resnet", "mobilenet"])
def test_eval_mode_batchnorm_folding_is_refused_in_one_line(net):
    """Issue 39 item 4: W' = Wγ/σ and b' = β - μγ/σ train as another parametrisation than
    PyTorch's W, γ, β (and a fresh BatchNorm's b' = 0 is not even in the file): refused, one
    line naming the layers and the remedy; ``as_exported=True`` trains the file as it is."""
    path = EXPORTS / f"{net}_eval_default.onnx"
    with pytest.raises(ONNXLoadError) as caught:
        from_onnx(path)
    line = str(caught.value)
    assert "\n" not in line and "cannot train as its source did" in line
    assert "folded BatchNorm" in line and ("stem.1" in line or "block1.bn1" in line
                                           or "blocks.0.body.1" in line)
    assert "optimize=False" in line and "dynamic_shapes" in line and "as_exported=True" in line
    with pytest.warns(UserWarning, match="trains as exported"):
        graph = from_onnx(path, as_exported=True)
    assert graph.parameters and not any(n.startswith("cannot train") for n in graph.notes)
    # inspection refuses nothing and says why
    from meta.lv1.summary import summarize

    assert "note: cannot train as its source did" in summarize(quiet(path,
                                                                     check_operators=False))


def _recipe(tmp_path, model):
    from meta.run.recipe import AtMost, make_recipe
    from meta.run.runner import run_recipe

    data = {"name": "synthetic", "train_examples": 16, "test_examples": 8,
            "input_shape": [3, 8, 8]}
    recipe = make_recipe("bn", {"dataset": data, "model": model},
                         {"epochs": 1, "batch_size": 8, "seed": 0},
                         {"train_loss": AtMost(100.0)})
    return run_recipe(recipe, stream=io.StringIO(), output_dir=tmp_path, progress=False,
                      export_onnx=False)


def test_a_train_mode_folded_batchnorm_has_one_outcome_on_every_path(tmp_path):
    """Issue 39 item 10: from_onnx, a user's model function and ``meta run``'s onnx model all
    refuse the file with the same line, and all take it with the opt-in."""
    from meta.common.component import ComponentError
    from meta.run.errors import one_line_errors
    from meta.run.recipe import RecipeError

    path = EXPORTS / "bn_cnn_default.onnx"
    with pytest.raises(ONNXLoadError) as direct:
        from_onnx(path)
    expected = str(direct.value)
    assert "\n" not in expected and "as_exported=True" in expected

    def model_function(input_shape, classes, seed, dtype, as_exported: bool = False):
        return from_onnx(path, as_exported=as_exported)

    for model in ({"name": "onnx", "path": str(path)}, model_function):
        with pytest.raises(one_line_errors()) as run:
            _recipe(tmp_path / "refused", model)
        assert expected in str(run.value), str(run.value)
    # The opt-in gets past the loader on every path (the synthetic data has 10 classes, the
    # file's logits 5: the next check, the data's, is a different one line).
    for model in ({"name": "onnx", "path": str(path), "as_exported": True},
                  {"name": model_function, "as_exported": True}):
        with pytest.raises((RecipeError, ComponentError, *one_line_errors())) as run:
            _recipe(tmp_path / "opted", model)
        assert "cannot train as its source did" not in str(run.value), str(run.value)
        assert "give 5 classes" in str(run.value), str(run.value)
    graph = quiet(path, as_exported=True)
    assert any(n.startswith(AS_EXPORTED) for n in graph.notes)


@pytest.mark.parametrize("executor", EXECUTOR_NAMES)
def test_deep_copied_encoder_layers_are_not_tied(executor):
    """Issue 39 item 9: the two layers of a default-exported nn.TransformerEncoder start equal
    and the exporter's optimizer merged them (W^T too); meta keeps them apart as PyTorch's
    separate parameters: every value of PyTorch's trains, 20 steps within 1e-5."""
    graph = quiet_load("encoder", "default")
    assert not graph.ties
    torch_values = sum(int(np.prod(s)) for s in info("encoder")["torch_parameters"].values())
    assert sum(v.size for v in graph.parameters.values()) == torch_values
    assert any("equal is not tied" in n for n in graph.notes)
    assert any("@encoder.layers.1.self_attn.in_proj_weight" in k for k in graph.parameters)
    ref = reference("exports/encoder")
    np.testing.assert_allclose(train(graph, ref, executor), ref["losses"], rtol=0,
                               atol=TOLERANCE)


def test_untie_is_a_recipe_model_option():
    """``untie`` reaches from_onnx from a recipe's onnx model options; the real tie (GPT's
    head, the embedding transposed) stays one parameter without it."""
    from meta.lv1 import MODELS, build_model

    component = MODELS["onnx"]
    path = str(EXPORTS / "gpt_default.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tied = build_model(component, {"path": path}, (5,), 11, 0, np.float32)
        untied = build_model(component, {"path": path, "untie": True}, (5,), 11, 0, np.float32)
    assert tied.ties and not untied.ties
    assert len(untied.parameters) == len(tied.parameters) + 1
    run = EXECUTORS["reference"](tied)
    ids = reference("exports/gpt")["inputs"][0]
    head = run.inference({"input": ids}, ["val_50"])["val_50"]
    np.testing.assert_array_equal(head, tied.initializers["head.weight"].T)
