"""Saved tokenizers (``meta.lv2.tokenizers``): char and byte vocabularies written and read back
to the same bytes, into a model's metadata and out; what is not one meta wrote is one line
naming the file."""

from __future__ import annotations

import pytest

from meta.lv1 import gpt, to_onnx
from meta.lv2.text import Vocabulary
from meta.lv2.tokenizers import (
    TokenizerError,
    add_to_model,
    load_tokenizer,
    model_tokenizer,
    save_tokenizer,
    tokenizer_from_json,
    tokenizer_json,
)


@pytest.mark.parametrize("vocab", [Vocabulary.from_text("naïve \"quotes\"\n\t\\ 東京"),
                                   Vocabulary()])
def test_written_and_read_back_to_the_same_bytes(vocab, tmp_path):
    text = tokenizer_json(vocab)
    again = tokenizer_from_json(text)
    assert tokenizer_json(again) == text and again.kind == vocab.kind
    assert again.symbols == vocab.symbols
    path = save_tokenizer(vocab, tmp_path)
    assert tokenizer_json(load_tokenizer(tmp_path)) + "\n" == path.read_text(encoding="utf-8")
    model = to_onnx(gpt((4,), classes=3, layers=1, heads=1, width=4))
    add_to_model(model, vocab)
    add_to_model(model, vocab)  # replaces, never duplicates
    assert len(model.metadata_props) == 1
    assert tokenizer_json(model_tokenizer(model, "m")) == text


@pytest.mark.parametrize("text, message", [
    ("not json", "t.json: not a tokenizer meta wrote"),
    ('{"kind": "char", "symbols": ["a"]}', "t.json: not a tokenizer meta wrote (format None"),
    ('{"format": 1, "kind": "wordpiece"}', "t.json: unknown tokenizer kind 'wordpiece'"),
])
def test_what_meta_did_not_write_is_named(text, message):
    with pytest.raises(TokenizerError, match=message.replace("(", r"\(")):
        tokenizer_from_json(text, "t.json")


def test_a_model_without_a_tokenizer_is_named(tmp_path):
    import onnx

    onnx.save(to_onnx(gpt((4,), classes=3, layers=1, heads=1, width=4)),
              str(tmp_path / "model.onnx"))
    with pytest.raises(TokenizerError, match="model.onnx holds no tokenizer"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer(tmp_path / "nothing")
