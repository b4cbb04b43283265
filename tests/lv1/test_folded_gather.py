"""A default export that gathered a parameter with repeated indices into a new initializer
(T5's relative position bias of a fixed sequence) is refused in one line, not trained apart."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from meta.lv1.onnx_io import ONNXLoadError, from_onnx

ARCH = Path(__file__).resolve().parents[1] / "fixtures/pytorch/architectures"
EXPORTS = Path(__file__).resolve().parents[1] / "fixtures/pytorch/exports"


def test_t5s_folded_relative_position_bias_is_refused_with_the_remedy():
    with pytest.raises(ONNXLoadError) as err:
        from_onnx(str(ARCH / "t5_default.onnx"))
    line = str(err.value)
    assert "\n" not in line
    assert "block.0.relative_attention_bias.weight" in line and "repeated indices" in line
    assert "optimize=False" in line and "as_exported=True" in line


def test_as_exported_trains_the_gathered_copies_and_says_so():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = from_onnx(str(ARCH / "t5_default.onnx"), as_exported=True)
    said = [str(w.message) for w in caught if "repeated indices" in str(w.message)]
    assert len(said) == 1 and "trains as exported" in said[0]
    assert "unsqueeze_2" in graph.parameters


@pytest.mark.parametrize("path", [ARCH / "gpt2_default.onnx", ARCH / "vit_default.onnx",
                                  EXPORTS / "gpt_default.onnx", EXPORTS / "bert_default.onnx"])
def test_transposes_and_distinct_row_gathers_are_not_taken_for_it(path):
    """W^T and a position embedding gathered by arange repeat no value: they load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = from_onnx(str(path))
    assert not any("repeated indices" in n for n in graph.notes)


def test_chance_equal_weights_of_a_transpose_are_not_taken_for_a_gather():
    """Random float32 weights collide by chance (a 256 x 256 W^T: ~130 repeats): only a fold
    through a gather whose values repeat a lot is refused."""
    from meta.lv1.onnx_io import _gathered_notes

    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    w.flat[:200] = w.flat[200:400]                       # a few chance-equal values
    table = rng.standard_normal((32, 4)).astype(np.float32)
    bias = table[rng.integers(0, 32, (8, 8))].transpose(2, 0, 1)[None]
    init = {"val_1": w, "unsqueeze_2": bias}
    sig = {"h.weight", "rel.weight"}
    assert _gathered_notes(init, sig, {"val_1": ["h.weight", "permute"]}) == []
    assert _gathered_notes(init, sig, {"val_1": ["h.weight", "embedding_1"]}) == []
    said = _gathered_notes(init, sig, {"unsqueeze_2": ["rel.weight", "embedding_1", "permute"]})
    assert len(said) == 1 and "rel.weight" in said[0]
    assert _gathered_notes(init, sig, {"unsqueeze_2": ["rel.weight", "permute"]}) == []
