"""Every public definition meta re-exports has a docstring, and coverage does not slip back."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ["meta", "meta.lv0", "meta.lv1", "meta.lv2", "meta.lv3", "meta.bench"]
# Known gaps in modules another change is rewriting now; remove each once documented.
KNOWN_GAPS = {"meta.lv3.strategy_class"}


@pytest.mark.parametrize("package", PUBLIC)
def test_every_re_exported_definition_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    assert inspect.getdoc(module), f"{package} has no module docstring"
    missing = [f"{package}.{name}" for name in getattr(module, "__all__", [])
               if (inspect.isclass(obj := getattr(module, name)) or inspect.isfunction(obj)
                   or inspect.ismodule(obj)) and not inspect.getdoc(obj)]
    assert not set(missing) - KNOWN_GAPS, f"undocumented: {missing}"


def test_docstring_coverage_stays_above_its_floor() -> None:
    """meta/ 56 % and ops/ 13 % before issue 31 (its count); by tools/docstring_coverage.py's
    count 76 % and 29 % before and 88 % and 96 % after."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import docstring_coverage
    finally:
        sys.path.remove(str(ROOT / "tools"))
    defs = docstring_coverage.definitions()
    share = {area: sum(d[2] for d in defs if d[0] == area) / sum(d[0] == area for d in defs)
             for area in ("meta", "ops")}
    assert share["meta"] >= 0.85 and share["ops"] >= 0.95, share
