"""Byte-level BPE subwords (``meta.lv2.bpe``, Hugging Face tokenizers): trained on the corpus
to the asked size, lossless on any text, saved and read back to the same bytes, selected in the
text dataset, saved with a run and sampled from; without the library, one line naming the
extra."""

from __future__ import annotations

import io
import sys

import pytest

from meta.lv2 import DATASETS, build_dataset
from meta.lv2.datasets import DatasetError
from meta.lv2.tokenizers import TOKENIZER_JSON, load_tokenizer, tokenizer_from_json, \
    tokenizer_json

TEXT = ("O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name;\n"
        "Or, if thou wilt not, be but sworn my love,\nAnd I'll no longer be a Capulet.\n") * 8


def test_trained_to_the_size_lossless_and_saved_bit_identically():
    pytest.importorskip("tokenizers")
    from meta.lv2.bpe import BPETokenizer

    tok = BPETokenizer.train(TEXT, vocab_size=300)
    assert len(tok) == 300
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT) / 2  # subwords: fewer tokens than characters
    for text in (TEXT, "naïve Zebra — 東京\n"):  # any text: bytes are the alphabet
        assert tok.decode(tok.encode(text)) == text
    saved = tokenizer_json(tok)
    again = tokenizer_from_json(saved)
    assert tokenizer_json(again) == saved and (again.encode(TEXT) == ids).all()
    assert tokenizer_json(BPETokenizer.train(TEXT, vocab_size=300)) == saved  # deterministic


def test_selected_in_the_text_dataset(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "play.txt").write_text(TEXT)
    train, test, _ = build_dataset(DATASETS["text"], {
        "files": [str(tmp_path / "play.txt")], "context": 8, "tokenizer": "bpe",
        "vocab_size": 280}, seed=0)
    assert train.vocabulary.kind == "bpe" and len(train.vocabulary) == 280
    assert train.inputs.max() < 280 and test.vocabulary is train.vocabulary


def test_without_the_library_one_line_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "play.txt").write_text(TEXT)
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers fails
    with pytest.raises(DatasetError) as err:
        build_dataset(DATASETS["text"], {"files": [str(tmp_path / "play.txt")],
                                         "tokenizer": "bpe"}, seed=0)
    assert str(err.value) == ("dataset 'text': tokenizer 'bpe' needs Hugging Face tokenizers, "
                              "not installed: pip install 'meta-dnn[text]' (Hugging Face "
                              "tokenizers)")


def test_a_bpe_run_saves_its_tokenizer_and_samples(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from meta.cli import main
    from meta.lv3 import SingleProcessCommunicator
    from meta.run.recipe import AtMost, make_recipe
    from meta.run.runner import run_recipe

    (tmp_path / "play.txt").write_text(TEXT)
    recipe = make_recipe("lm", {
        "dataset": {"name": "text", "files": [str(tmp_path / "play.txt")], "context": 8,
                    "tokenizer": "bpe", "vocab_size": 280},
        "model": {"name": "gpt", "layers": 1, "heads": 2, "width": 16},
        "optimizer": "adam", "executor": "reference",
    }, {"epochs": 1, "batch_size": 8, "lr": 1e-2, "seed": 0}, {"test_loss": AtMost(20.0)})
    run_recipe(recipe, SingleProcessCommunicator(), stream=io.StringIO(), progress=False,
               output_dir=tmp_path / "run")
    (tmp_path / "play.txt").unlink()
    saved = (tmp_path / "run" / TOKENIZER_JSON).read_text(encoding="utf-8")
    assert saved.startswith('{"format":1,"kind":"bpe"')
    for source in (tmp_path / "run", tmp_path / "run" / "model.onnx"):
        assert tokenizer_json(load_tokenizer(source)) + "\n" == saved
    assert main(["sample", str(tmp_path / "run"), "--prompt", "Romeo", "--tokens", "12"]) == 0
    assert capsys.readouterr().out.startswith("Romeo")


def test_bits_per_character_converts_a_bpe_loss_per_token(tmp_path):
    pytest.importorskip("tokenizers")
    import math
    from types import SimpleNamespace

    from meta.lv2 import METRICS
    from meta.lv2.text import characters_per_token

    (tmp_path / "play.txt").write_text(TEXT)
    _, test, _ = build_dataset(DATASETS["text"], {
        "files": [str(tmp_path / "play.txt")], "context": 8, "tokenizer": "bpe",
        "vocab_size": 280}, seed=0)
    ratio = characters_per_token(test)
    assert ratio > 1.5  # subwords
    metric = METRICS["bits_per_character"].build()
    got = metric.compute(SimpleNamespace(test_data=test), [{"test_loss": 3.0}])
    assert math.isclose(got, 3.0 / math.log(2) / ratio)
