"""Each level imports only from the levels below it (and ops/ only from Level 0)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = ("meta.recipe", "meta.runner", "meta.cli")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def level_of(module: str) -> int | None:
    for level in range(4):
        if module == f"meta.lv{level}" or module.startswith(f"meta.lv{level}."):
            return level
    return 4 if module.startswith(TOP) else None


@pytest.mark.parametrize("level", range(4))
def test_levels_import_only_from_below(level):
    offenders = []
    for path in sorted((REPO / "meta" / f"lv{level}").rglob("*.py")):
        for module in imported_modules(path):
            used = level_of(module)
            if used is not None and used > level:
                offenders.append(f"{path.relative_to(REPO)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_operators_use_only_level_0():
    offenders = [f"{p.relative_to(REPO)} imports {m}"
                 for p in sorted((REPO / "ops").rglob("*.py"))
                 for m in imported_modules(p) if (level_of(m) or 0) > 0]
    assert not offenders, "\n".join(offenders)
