"""A recipe's input paths (options declared ``path=True``: the text dataset's ``files``, the
arrays dataset's ``path``, the onnx model's ``path``, ...) are read beside the recipe file
first, then in the working directory; one found in neither is refused before any data is
loaded, naming the path and every place looked at (issue 45 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from meta.common.files import MissingInput, find_input
from meta.run.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[1]
TEXT = "O Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy name.\n" * 8
RECIPE = '''
from meta.run.recipe import AtMost
FIXED = {"dataset": {"name": "text", "files": %s, "context": 8},
         "model": {"name": "lstm_lm", "hidden": 8, "embedding": 4}}
MUTABLE = {"epochs": 1, "batch_size": 8, "lr": 0.01, "seed": 0}
METRICS = {"test_loss": AtMost(1e9)}
'''


def _recipe(folder: Path, files: str = '["tiny.txt"]') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lm.py").write_text(RECIPE % files)
    return folder / "lm.py"


def _meta(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "meta", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_meta_run_from_another_folder_finds_the_file_beside_the_recipe(tmp_path):
    recipe = _recipe(tmp_path / "project")
    (tmp_path / "project" / "tiny.txt").write_text(TEXT)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _meta("run", str(recipe), "--quiet", "--no-export", "--output-dir",
                 str(tmp_path / "out"), cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "lm: PASS" in done.stdout


def test_a_missing_file_names_the_path_and_every_place_looked_at(tmp_path):
    recipe = _recipe(tmp_path / "project")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _meta("run", str(recipe), "--quiet", "--no-export", "--output-dir",
                 str(tmp_path / "out"), cwd=elsewhere)
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert "'tiny.txt' not found" in err and "option 'files'" in err, err
    assert f"{tmp_path / 'project' / 'tiny.txt'} (beside the recipe)" in err, err
    assert f"{elsewhere.resolve() / 'tiny.txt'} (in the working directory)" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_working_directory_is_the_second_place(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.txt").write_text(TEXT)
    files = load_recipe(recipe).definitions.choices["dataset"].values()["files"]
    assert files == (str(tmp_path.resolve() / "tiny.txt"),)
    (tmp_path / "project" / "tiny.txt").write_text(TEXT)  # beside the recipe wins
    files = load_recipe(recipe).definitions.choices["dataset"].values()["files"]
    assert files == (str(tmp_path / "project" / "tiny.txt"),)


def test_set_and_absolute_paths(tmp_path, monkeypatch):
    recipe = _recipe(tmp_path / "project", '["a.txt"]')
    (tmp_path / "project" / "a.txt").write_text(TEXT)
    (tmp_path / "project" / "b.txt").write_text(TEXT)
    monkeypatch.chdir(tmp_path)
    loaded = load_recipe(recipe)
    text = loaded.fixed["dataset"]
    assert text["files"] == ["a.txt"]  # the recipe as written; its definitions resolved
    moved = loaded.definitions.as_dict()["dataset.files"]
    assert moved == [str(tmp_path / "project" / "a.txt")]
    with pytest.raises(RecipeError, match="not FIXED|FIXED"):
        loaded.with_overrides({"files": "b.txt"})
    absolute = _recipe(tmp_path / "other", repr([str(tmp_path / "project" / "b.txt")]))
    assert load_recipe(absolute).definitions.as_dict()["dataset.files"] == \
        [str(tmp_path / "project" / "b.txt")]


def test_set_resolves_a_mutable_path_beside_the_recipe(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "a.txt").write_text(TEXT)
    (folder / "b.txt").write_text(TEXT)
    (folder / "lm.py").write_text(RECIPE.replace('"files": %s, ', "") .replace(
        'MUTABLE = {', 'MUTABLE = {"dataset.files": ["a.txt"], '))
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(folder / "lm.py").with_overrides({"dataset.files": "b.txt"})
    assert recipe.definitions.as_dict()["dataset.files"] == [str(folder / "b.txt")]
    with pytest.raises(RecipeError, match=r"'c.txt' not found: looked for .*beside the recipe"):
        load_recipe(folder / "lm.py").with_overrides({"dataset.files": "c.txt"})


def test_find_input(tmp_path):
    with pytest.raises(MissingInput, match=r"'/nowhere/x.npz' not found: looked for "
                                           r"/nowhere/x.npz$"):
        find_input("/nowhere/x.npz", [(tmp_path, "beside the recipe")])
    (tmp_path / "data").mkdir()
    assert find_input("data", [(tmp_path, "")]) == tmp_path / "data"  # a folder too
