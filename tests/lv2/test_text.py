"""Text data for language models: vocabularies, blocks, the seeded split, Tiny Shakespeare,
integer inputs and per-token targets through the dataset registry and the trainer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meta.lv1 import ReferenceExecutor, gpt
from meta.lv2 import (
    DATASETS,
    METRICS,
    OPTIMIZERS,
    ArrayDataset,
    ShuffleSampler,
    Trainer,
    build_dataset,
    build_optimizer,
)
from meta.lv2.dataset_registry import as_dataset, as_model_input
from meta.lv2.datasets import IGNORE_INDEX, DatasetError
from meta.lv2.text import Vocabulary, blocks, split, tinyshakespeare
from meta.lv2.trainer import hits

def test_char_and_byte_vocabularies_round_trip():
    chars = Vocabulary.from_text("to be, or not")
    assert chars.kind == "char" and len(chars) == len(set("to be, or not"))
    assert chars.decode(chars.encode("not to be")) == "not to be"
    with pytest.raises(ValueError, match="character 'z' is not in the vocabulary"):
        chars.encode("zoo")
    raw = Vocabulary()
    assert raw.kind == "byte" and len(raw) == 256
    assert raw.decode(raw.encode("naïve")) == "naïve" and len(raw.encode("naïve")) == 6


def test_blocks_shift_targets_by_one_and_pad_the_last():
    x, y = blocks(np.arange(10), context=4)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (3, 4)
    np.testing.assert_array_equal(x[0], [0, 1, 2, 3])
    np.testing.assert_array_equal(y[0], [1, 2, 3, 4])
    np.testing.assert_array_equal(x[2], [8, 0, 0, 0])  # 9 targets in all: one in the last block
    np.testing.assert_array_equal(y[2], [9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX])


def test_the_split_is_seeded_ninety_ten_and_disjoint():
    x, y = blocks(np.arange(1001), context=10)  # 100 blocks
    train, val = split(x, y, 0.1, seed=3)
    assert (len(train), len(val)) == (90, 10)
    firsts = {int(r[0]) for r in train.inputs} | {int(r[0]) for r in val.inputs}
    assert len(firsts) == 100  # every block once
    again, _ = split(x, y, 0.1, seed=3)
    other, _ = split(x, y, 0.1, seed=4)
    np.testing.assert_array_equal(train.inputs, again.inputs)
    assert not np.array_equal(train.inputs, other.inputs)


def test_a_users_text_file_through_the_registry(tmp_path):
    (tmp_path / "a.txt").write_text("abcabcabd" * 20)
    train, test, _ = build_dataset(DATASETS["text"], {
        "files": [str(tmp_path / "a.txt")], "context": 8}, seed=0)
    assert train.inputs.dtype == np.int64 and train.inputs.shape[1:] == (8,)
    assert train.labels.shape == train.inputs.shape  # one target per token
    assert train.vocabulary.decode(train.inputs[0][:3]) in ("abc", "bca", "cab", "abd", "bda")
    assert len(train) + len(test) == math.ceil(179 / 8) and len(test) == 2
    with pytest.raises(DatasetError, match="missing.txt: text file not found"):
        build_dataset(DATASETS["text"], {"files": [str(tmp_path / "missing.txt")]}, seed=0)


def test_tiny_shakespeare_from_the_shared_folder(tinyshakespeare_dir, monkeypatch, tmp_path):
    if tinyshakespeare_dir is None:
        pytest.skip("no Tiny Shakespeare in ../shared/datasets (nor $META_TINYSHAKESPEARE_DIR)")
    train, val, _ = build_dataset(DATASETS["text"], {"context": 64}, seed=0)
    assert len(train.vocabulary) == 65
    assert len(val) == round((len(train) + len(val)) * 0.1)
    assert train.vocabulary.decode(train.inputs[0]).startswith("First Citizen:")
    (tmp_path / "input.txt").write_text("not Shakespeare")
    monkeypatch.setenv("META_TINYSHAKESPEARE_DIR", str(tmp_path))
    with pytest.raises(DatasetError, match="input.txt: md5 .* does not match"):
        tinyshakespeare()


def test_integer_inputs_stay_integers_and_per_token_labels_are_kept():
    ids = np.arange(12).reshape(3, 4) % 5
    targets = (ids + 1) % 5
    targets[2, 2:] = IGNORE_INDEX
    data = as_dataset((ids.astype(np.int32), targets), "t")
    assert data.inputs.dtype == np.int64 and data.labels.shape == (3, 4)
    assert as_dataset((ids.astype(np.float64), targets), "t").inputs.dtype == np.float32
    # pixels as integers still reach an image model as its floats
    assert as_model_input(data, np.float32).inputs.dtype == np.float32
    assert as_model_input(data, np.int64) is data
    bad = targets.copy()
    bad[0, 0] = -3
    with pytest.raises(DatasetError, match=r"class indices >= 0 \(or -100 for padding\), "
                                           r"found -3"):
        as_dataset((ids, bad), "t")
    with pytest.raises(DatasetError, match="class indices >= 0, found -100"):
        as_dataset((ids[:, 0], np.array([0, IGNORE_INDEX, 1])), "t")  # one per example: no pad


def test_hits_count_tokens_and_skip_padding():
    labels = np.array([[0, 1, IGNORE_INDEX], [1, 1, 0]])
    logits = np.zeros((2, 2, 3))
    logits[:, 1] = 1.0  # predicts class 1 everywhere
    assert hits(logits, labels) == (3, 5)
    assert hits(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([1, 1])) == (1, 2)


def test_a_gpt_learns_per_token_targets_with_padding():
    text = "the cat sat on the mat. " * 20
    vocab = Vocabulary.from_text(text)
    x, y = blocks(vocab.encode(text), context=16)  # the last block is padded
    assert (y == IGNORE_INDEX).any()
    data = ArrayDataset(x, y, vocab)
    graph = gpt((16,), len(vocab), layers=1, heads=2, width=16)
    executor = ReferenceExecutor(graph)
    sampler = ShuffleSampler(len(data), 8, seed=0)
    optimizer = build_optimizer(OPTIMIZERS["adamw"], {"lr": 1e-2}, graph.parameters,
                                len(sampler), 4)
    trainer = Trainer(executor, optimizer, data, sampler, data)
    history = trainer.fit(4)
    assert history[-1]["test_loss"] < history[0]["train_loss"] - 0.5
    assert history[-1]["test_accuracy"] > 0.4  # per token, padding skipped
    assert METRICS["perplexity"].build().compute(trainer, history) == pytest.approx(
        math.exp(history[-1]["test_loss"]))
    assert METRICS["bits_per_character"].build().compute(trainer, history) == pytest.approx(
        history[-1]["test_loss"] / math.log(2))
