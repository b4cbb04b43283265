"""A language model's text inputs checked before training (issue 44): ``sample_text`` with a
prompt outside the corpus' vocabulary, or on a dataset that has none, is one line and exit 2
before the first step (it failed after a whole epoch); ``--resume`` on a corpus whose
vocabulary has as many characters but other ids is refused in one line (it trained on)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from meta.cli import EXIT_ERROR, main
from meta.lv2.checkpoint import load_checkpoint, vocabulary_digest
from meta.lv2.text import Vocabulary

RECIPE = """
    from meta.run.recipe import AtMost
    FIXED = {{"dataset": {dataset}, "model": {model},
              "events": [{{"name": "sample_text", "length": 4, "prompt": {prompt!r}}}]}}
    MUTABLE = {{"epochs": {epochs}, "batch_size": 8}}
    METRICS = {{"test_loss": AtMost(100.0)}}
"""


def _recipe(tmp_path: Path, prompt: str = "ab", dataset: str = "", epochs: int = 1,
            model: str = '{"name": "lstm_lm", "hidden": 8, "embedding": 4}') -> str:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("abcd dcba " * 40)
    dataset = dataset or repr({"name": "text", "files": [str(corpus)], "context": 8})
    path = tmp_path / "lm.py"
    path.write_text(textwrap.dedent(RECIPE.format(dataset=dataset, prompt=prompt, model=model,
                                                  epochs=epochs)))
    return str(path)


def _run(recipe: str, out: Path, *args: str) -> int:
    return main(["run", recipe, "--output-dir", str(out), "--quiet", "--no-export", *args])


def _one_line_error(capsys: pytest.CaptureFixture, *needles: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("meta: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    assert "epoch" not in captured.out.lower(), captured.out  # no step was taken
    return err


def test_a_prompt_outside_the_vocabulary_exits_2_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(_recipe(tmp_path, prompt="abZ"), out) == EXIT_ERROR
    _one_line_error(capsys, "event 'sample_text'", "prompt 'abZ'", "'Z'",
                    "not in the vocabulary of 5 characters")
    assert not (out / "checkpoint.npz").exists()


def test_sample_text_on_a_dataset_without_a_vocabulary_exits_2_before_training(tmp_path,
                                                                                 capsys):
    dataset = repr({"name": "synthetic", "train_examples": 32, "test_examples": 16,
                    "input_shape": [8]})
    recipe = _recipe(tmp_path, dataset=dataset, model='"mlp"')
    assert _run(recipe, tmp_path / "out") == EXIT_ERROR
    _one_line_error(capsys, "event 'sample_text' on dataset 'synthetic'",
                    "no vocabulary", "'text' dataset")


def test_a_checkpoint_keeps_the_vocabulary_and_refuses_another_corpus(tmp_path, capsys):
    """Same size (5 characters), other characters: the ids mean other things."""
    recipe, out = _recipe(tmp_path, epochs=1), tmp_path / "out"
    assert _run(recipe, out) == 0
    info = load_checkpoint(out / "checkpoint.npz").info["vocabulary"]
    assert info == {"kind": "char", "size": 5,
                    "digest": vocabulary_digest(Vocabulary.from_text("abcd "))}
    recipe = _recipe(tmp_path, epochs=2)
    assert _run(recipe, out, "--resume") == 0  # the same corpus resumes
    (tmp_path / "corpus.txt").write_text("abce ecba " * 40)
    capsys.readouterr()
    assert _run(recipe, out, "--resume", "--set", "epochs=3") == EXIT_ERROR
    _one_line_error(capsys, "checkpoint.npz was trained on another vocabulary",
                    "char, 5 tokens", "without --resume")


def test_the_digest_tells_vocabularies_of_one_size_apart():
    assert vocabulary_digest(Vocabulary.from_text("abc")) == \
        vocabulary_digest(Vocabulary.from_text("cab"))
    assert vocabulary_digest(Vocabulary.from_text("abc")) != \
        vocabulary_digest(Vocabulary.from_text("abd"))
    assert vocabulary_digest(Vocabulary()) != vocabulary_digest(Vocabulary.from_text("abd"))
