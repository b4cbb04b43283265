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


# Modules another change is writing now (not yet committed); remove each once documented.
KNOWN_ATTRIBUTE_GAPS: tuple[str, ...] = ()


def test_every_public_attribute_of_level_3_has_a_docstring() -> None:
    """What a strategy writer reads on an instance (``flat_params``, ``param_chunks``,
    ``bytes_sent``, the communicator's ``rank``) is documented where help() and the API
    reference show it: a string right after the assignment, or inherited from a base class
    (issue 45: a user double-counted ``bytes_sent``)."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import docstring_coverage
    finally:
        sys.path.remove(str(ROOT / "tools"))
    found = docstring_coverage.attributes("meta.lv3")
    names = {q for q, _ in found}
    for must in ("meta.lv3.strategy.Strategy.flat_params", "meta.lv3.strategy.Strategy.bytes_sent",
                 "meta.lv3.strategy.Strategy.param_chunks", "meta.lv3.flat.FlatBuffer.views",
                 "meta.lv3.comm.communicator.MPICommunicator.comm"):
        assert must in names, f"the coverage script misses {must}"
    missing = [q for q, documented in found
               if not documented and not q.startswith(KNOWN_ATTRIBUTE_GAPS)]
    assert not missing, f"{len(missing)} undocumented public attributes: {missing[:20]}"


def test_the_attribute_count_reads_docstrings_not_comments(tmp_path) -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import docstring_coverage
    finally:
        sys.path.remove(str(ROOT / "tools"))
    module = tmp_path / "attr_sample.py"
    module.write_text(
        "class Base:\n"
        "    name = 'a'\n"
        "    '''Its name.'''\n\n"
        "class Child(Base):\n"
        "    name = 'b'\n"
        "    size: int = 0  # a comment is not a docstring\n\n"
        "    def __init__(self):\n"
        "        self.a, self.b = 1, 2\n"
        "        '''Both.'''\n"
        "        if True:\n"
        "            self.c = 3\n"
        "        self._hidden = 4\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import attr_sample
    finally:
        sys.path.remove(str(tmp_path))
    assert dict(docstring_coverage.class_attributes(attr_sample.Child)) == {
        "name": False, "size": False, "a": True, "b": True, "c": False}
    assert dict(docstring_coverage.class_attributes(attr_sample.Base)) == {"name": True}
