"""Level 3's old flat module paths still import, as the moved modules, with a deprecation."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import meta.lv3
from meta.common.moved import absolute
from meta.lv3 import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_is_the_new_module(old):
    new = importlib.import_module(absolute("meta.lv3", MOVED[old]))
    sys.modules.pop(f"meta.lv3.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"meta.lv3.{old} moved to {new.__name__}"):
        moved = importlib.import_module(f"meta.lv3.{old}")
    assert moved is new
    assert new.__spec__.name == new.__name__  # the real module keeps its own spec


def test_from_imports_of_old_paths_work_in_a_fresh_process():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n"
            "    from meta.lv3.allreduce import Allreduce\n"
            "except DeprecationWarning as w: print(w)\n"
            "warnings.simplefilter('ignore')\n"
            "from meta.lv3.allreduce import Allreduce\n"
            "from meta.lv3.survival import ulfm_on\n"
            "from meta.lv3 import pipeline_executor, Allreduce as A\n"
            "from meta.lv3.pipeline import Pipeline\n"
            "assert Allreduce is A and pipeline_executor.__name__ == 'meta.lv3.pipeline.stage'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "meta.lv3.allreduce moved to meta.lv3.data_parallel.allreduce" in out


def test_every_old_module_name_is_gone_from_the_top():
    top = {p.stem for p in Path(meta.lv3.__file__).parent.glob("*.py")}
    assert not top & set(MOVED)


def test_lv3_has_at_most_16_entries_at_its_top():
    root = Path(meta.lv3.__file__).parent
    entries = [p.name for p in root.iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 16, sorted(entries)


@pytest.mark.parametrize("package, home, name", [
    ("parameter_server", "central", "ROSTER"), ("pipeline", "strategy", "MAX_MICRO_BATCHES"),
    ("hybrid", "grid", "Pipeline"), ("sandblaster", "strategy", "Dispatcher")])
def test_a_package_in_an_old_modules_place_forwards_its_other_names(package, home, name):
    """``meta.lv3.pipeline`` was a module and is now a package: what the module held beyond
    the package's exports still imports from it, with a deprecation naming the new place."""
    new = importlib.import_module(f"meta.lv3.{package}.{home}")
    with pytest.warns(DeprecationWarning, match=f"meta.lv3.{package}.{name} moved to "):
        value = getattr(importlib.import_module(f"meta.lv3.{package}"), name)
    assert value is getattr(new, name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        importlib.import_module(f"meta.lv3.{package}").nothing


def test_the_mlp_builder_keeps_its_old_name_for_one_release():
    """``meta.lv1.builder.mlp`` moved to ``meta.lv1.models`` (beside the other builders); the
    old name is the same function, with a DeprecationWarning."""
    import meta.lv1.builder as builder
    from meta.lv1 import mlp

    with pytest.warns(DeprecationWarning, match="meta.lv1.builder.mlp moved to meta.lv1.models"):
        assert builder.mlp is mlp
