"""The README, the front page, holds what it shows: its commands are CI's, its recipe is one
meta accepts, its links lead to pages that exist, and it stays a front page (the guide's code
blocks are tests/test_docs.py's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The README's three commands, word for word: CI installs and tests with them (.ci/run).
INSTALL = '.venv/bin/pip install -e ".[test]"'
QUICK_START = """\
python3 -m venv .venv && .venv/bin/pip install -e ".[test]"   # install everything, builds cpp/
.venv/bin/meta run recipes/mnist_mlp.py                         # the main job
.venv/bin/python -m pytest                                      # the tests
"""


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_front_page_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_commands_are_ci_s() -> None:
    assert QUICK_START in _blocks("sh"), "the README's install, main job and test commands moved"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\n.venv/bin/python -m pytest\n" in ci  # the README's test command, as CI runs it
    assert '.venv/bin/pip install -e ".[test' in ci  # its install, with CI's extras beside test


def test_recipe_runs_as_written(tmp_path, monkeypatch) -> None:
    """The ten-line recipe loads and validates as `meta run my_mlp.py` would load it (the run
    itself is the main job's, tests/e2e)."""
    from meta.recipe import load_recipe

    (recipe,) = _blocks("python")
    assert len(recipe.splitlines()) <= 10
    path = tmp_path / "my_mlp.py"
    path.write_text(recipe)
    monkeypatch.chdir(tmp_path)
    loaded = load_recipe(path)
    assert loaded.name == "my_mlp"
    loaded.with_overrides({"lr": "0.1"})  # the README runs it with --set lr=0.1
    exec(compile(recipe, str(README), "exec"), {})


def test_links_lead_somewhere() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 20
    missing = [link for link in links if "://" not in link and not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
