"""The environment record: every field present, MPI never initialised to fill it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from meta.bench.environment import environment, git_state, recipe_hash, recipe_record
from tests.launch import clean_env

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"created", "python", "platform", "numpy", "meta", "git", "cpu", "threads", "mpi",
          "frameworks", "ranks", "seeds", "recipes"}


def test_record_has_every_field(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("FIXED = {}\n")
    record = environment({"r": recipe_record(recipe, {"lr": "0.1"})}, ranks=1,
                         seeds={"recipe": 0, "bootstrap": 0})
    assert FIELDS <= set(record)
    assert record["python"]["version"].count(".") == 2
    assert record["numpy"]["version"] and isinstance(record["numpy"]["blas"], list)
    assert all("num_threads" in p for p in record["threads"]["threadpools"])
    assert record["cpu"]["cores"] >= 1 and record["cpu"]["model"]
    assert record["seeds"] == {"recipe": 0, "bootstrap": 0}
    assert record["recipes"]["r"]["sha256"] == recipe_hash(recipe, {"lr": "0.1"})
    json.dumps(record)  # it goes into a JSON report as it is


def test_git_commit_and_dirty_flag():
    state = git_state()
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        assert state == {"commit": head, "dirty": state["dirty"]}
        assert isinstance(state["dirty"], bool)


def test_no_git_outside_a_checkout(tmp_path):
    assert git_state(tmp_path) is None


def test_recipe_hash_covers_file_and_overrides(tmp_path):
    recipe = tmp_path / "r.py"
    recipe.write_text("FIXED = {}\n")
    base = recipe_hash(recipe)
    assert recipe_hash(recipe, {"lr": "0.1"}) != base
    assert recipe_hash(recipe, {"a": "1", "b": "2"}) == recipe_hash(recipe, {"b": "2", "a": "1"})
    recipe.write_text("FIXED = {'lr': 0.1}\n")
    assert recipe_hash(recipe) != base


def test_recording_does_not_initialise_mpi():
    code = ("import sys, json; from meta.bench import environment; r = environment(); "
            "print(json.dumps([r['mpi'], 'mpi4py.MPI' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), check=True).stdout
    assert json.loads(out) == [None, False]


def test_frameworks_loaded_are_recorded_with_their_threads():
    """Each framework a comparison ran is named with its version and threads, only once it is
    loaded: recording imports none."""
    from meta.bench.environment import frameworks_record
    from meta.lv1.plan import runtime

    record = frameworks_record()
    assert ("torch" in record) == ("torch" in sys.modules)
    if runtime.available():
        runtime.module()
        onednn = frameworks_record()["onednn"]
        assert onednn["version"].count(".") == 2 and onednn["threads"] >= 1
        assert onednn["bf16_native"] in (True, False)  # whether precision="bf16" pays here
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    record = frameworks_record()["torch"]
    assert record["version"] == torch.__version__ and record["threads"] >= 1
