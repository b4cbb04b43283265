"""``meta sample`` on a finished run: a tiny GPT trained for one epoch on a text file the test
writes, then sampled from its run folder and from its model.onnx alone, with the corpus gone;
the tokenizer saved with the run reads back to the same bytes; mistakes are one line, exit 2."""

from __future__ import annotations

import io
import shutil

import onnx
import pytest

from meta.cli import main
from meta.lv2.tokenizers import METADATA_KEY, TOKENIZER_JSON, load_tokenizer, tokenizer_json
from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import AtMost, make_recipe
from meta.run.runner import run_recipe

TEXT = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n" * 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm")
    (tmp / "play.txt").write_text(TEXT)
    recipe = make_recipe("lm", {
        "dataset": {"name": "text", "files": [str(tmp / "play.txt")], "context": 16},
        "model": {"name": "gpt", "layers": 1, "heads": 2, "width": 16},
        "optimizer": "adam", "executor": "reference",
    }, {"epochs": 1, "batch_size": 8, "lr": 1e-2, "seed": 0}, {"test_loss": AtMost(10.0)})
    run_recipe(recipe, SingleProcessCommunicator(), stream=io.StringIO(), progress=False,
               output_dir=tmp / "run")
    (tmp / "play.txt").unlink()  # sampling must not need the corpus
    return tmp / "run"


def test_the_run_saves_its_tokenizer_in_the_folder_and_the_model(run_dir):
    from meta.lv2.text import Vocabulary

    saved = (run_dir / TOKENIZER_JSON).read_text(encoding="utf-8")
    assert saved == tokenizer_json(Vocabulary.from_text(TEXT)) + "\n"
    props = {p.key: p.value for p in onnx.load(str(run_dir / "model.onnx")).metadata_props}
    assert props[METADATA_KEY] + "\n" == saved
    for source in (run_dir, run_dir / "model.onnx"):
        again = load_tokenizer(source)
        assert tokenizer_json(again) + "\n" == saved  # bit-identical
        assert again.decode(again.encode("Romeo")) == "Romeo"


def test_meta_sample_prints_text_from_a_prompt(run_dir, tmp_path, capsys):
    args = ["--prompt", "Ro", "--tokens", "30", "--temperature", "0"]
    assert main(["sample", str(run_dir), *args]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Ro") and len(text) == 2 + 30 + 1  # a character a token, newline
    assert set(text) <= set(TEXT)
    alone = tmp_path / "model.onnx"  # the model file alone: its metadata holds the tokenizer
    shutil.copy(run_dir / "model.onnx", alone)
    assert main(["sample", str(alone), *args]) == 0
    assert capsys.readouterr().out == text
    assert main(["sample", str(alone), *args, "--no-cache"]) == 0  # recomputing: same tokens
    assert capsys.readouterr().out == text
    assert main(["sample", str(run_dir), "--tokens", "25", "--top-k", "3", "--seed", "1"]) == 0
    assert len(capsys.readouterr().out) == 1 + 25 + 1


def test_a_prompt_outside_the_vocabulary_is_one_line_and_exit_2(run_dir, capsys):
    assert main(["sample", str(run_dir), "--prompt", "Zebra"]) == 2
    err = capsys.readouterr().err
    assert err == "meta: error: --prompt: character 'Z' is not in the vocabulary of 23 " \
        "characters\n", err


def test_a_negative_temperature_is_a_usage_error(run_dir, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sample", str(run_dir), "--temperature", "-1"])
    assert exit_.value.code == 2
    assert "expected a finite number >= 0, got '-1'" in capsys.readouterr().err


def test_a_folder_without_a_model_is_one_line(tmp_path, capsys):
    assert main(["sample", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "has no model.onnx" in err and err.count("\n") == 1


def test_a_model_without_a_tokenizer_is_one_line(tmp_path, capsys):
    from meta.lv1 import gpt, to_onnx

    onnx.save(to_onnx(gpt((4,), classes=3, layers=1, heads=1, width=4)),
              str(tmp_path / "model.onnx"))
    assert main(["sample", str(tmp_path / "model.onnx")]) == 2
    err = capsys.readouterr().err
    assert "holds no tokenizer (metadata meta.tokenizer)" in err and err.count("\n") == 1
