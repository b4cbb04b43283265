"""Each level imports only from the levels below it (and ops/ only from Level 0).

The floors of the package, from the ground up: ``meta.common`` (what every level imports: it
imports no level), Levels 0-3, then the top (``meta.run``, where a recipe becomes a run, the
tools ``meta.bench`` and ``meta.planner``, and the command line)."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = ("meta.run", "meta.recipe", "meta.bench", "meta.planner", "meta.cli")
COMMON = -1  # the ground floor, below Level 0


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
    if module == "meta.common" or module.startswith("meta.common."):
        return COMMON
    for level in range(4):
        if module == f"meta.lv{level}" or module.startswith(f"meta.lv{level}."):
            return level
    return 4 if module in TOP or module.startswith(tuple(f"{t}." for t in TOP)) else None


def test_common_imports_no_level():
    """meta/common is what every level imports, so it imports none of them (nor the top)."""
    offenders = [f"{p.relative_to(REPO)} imports {m}"
                 for p in sorted((REPO / "meta" / "common").rglob("*.py"))
                 for m in imported_modules(p) if (level_of(m) or COMMON) > COMMON]
    assert not offenders, "\n".join(offenders)


def test_the_package_root_holds_few_rooms():
    """The root of meta/ holds the levels, common/, run/, the tools and the command line: at
    most 12 modules and folders (the ops/ and recipes/ links, which point outside the package
    into the repository, and the package's own __init__/__main__ are not rooms)."""
    root = REPO / "meta"
    rooms = sorted(p.name for p in root.iterdir()
                   if not p.is_symlink() and p.name not in ("__init__.py", "__main__.py")
                   and (p.suffix == ".py" or (p / "__init__.py").is_file()))
    assert len(rooms) <= 12, rooms


def test_old_module_paths_import_the_moved_modules():
    """The modules that left the root keep their old path for one release, as the same
    module object, with a DeprecationWarning naming the new place; meta.recipe stays public."""
    import importlib
    import warnings

    import meta

    assert importlib.import_module("meta.recipe") is importlib.import_module("meta.run.recipe")
    for old, new in meta.MOVED.items():
        sys.modules.pop(f"meta.{old}", None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(f"meta.{old}")
        assert module is importlib.import_module(f"meta.{new}"), old
        assert any(f"meta.{new}" in str(w.message) for w in caught
                   if issubclass(w.category, DeprecationWarning)), old


@pytest.mark.parametrize("level", range(4))
def test_levels_import_only_from_below(level):
    """Level N imports common/ and Levels < N, never a higher level nor the top."""
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


# -- Level 3's wings (docs/design/architecture.md draws them) ----------------------------------------
META = REPO / "meta"
LV3 = META / "lv3"
# wing -> the parts of Level 3 it may import (besides itself); a top-level module is its own
# part ("strategy" is meta/lv3/strategy.py). strategies, report and pretraining may import
# every part: they are the registry and the runner's view of Level 3.
WINGS = {
    "comm": {"flat"},  # bf16: the chunks a reduce-scatter gives each rank (flat imports nothing)
    "flat": set(),
    "sampler": set(),
    "timeline": {"comm"},
    "workload": set(),  # what a strategy is built from (never the trainer)
    "strategy": {"comm", "flat", "timeline", "workload"},
    "data_parallel": {"comm", "flat", "strategy", "workload"},
    "parameter_server": {"comm", "flat", "strategy", "timeline", "workload"},
    "pipeline": {"comm", "strategy", "timeline", "workload"},
    "tensor_parallel": {"comm", "strategy", "pipeline", "workload"},
    "sandblaster": {"comm", "flat", "strategy", "timeline", "data_parallel", "workload"},
    "hybrid": {"comm", "flat", "strategy", "timeline", "pipeline", "parameter_server",
               "workload"},
}
ROOT_OF_LV3 = {"strategies", "report", "pretraining", "__init__"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in META.rglob("*.py")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@functools.cache
def _bound_in(package: str) -> frozenset[str]:
    """Names a package's __init__ binds at its top (the rest of ``from pkg import x`` are
    submodules, compiled ones included)."""
    tree = ast.parse(MODULES[package].read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def runtime_imports(path: Path) -> set[str]:
    """The modules of meta that ``path`` imports when it runs (at its top or inside a
    function), outside ``if TYPE_CHECKING:`` blocks; ``from pkg import sub`` counts as
    importing ``pkg.sub``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                is_package = MODULES.get(base, Path()).name == "__init__.py"
                found.add(sub if sub in MODULES or (is_package and alias.name
                                                     not in _bound_in(base)) else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in MODULES and m != name}


def test_no_import_circles_in_meta():
    graph = {name: runtime_imports(path) for name, path in MODULES.items()}
    circles, index, low, stack, on_stack = [], {}, {}, [], set()

    def connect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(" <-> ".join(sorted(component)))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_circle_check_sees_a_circle(tmp_path, monkeypatch):
    """The check above fails on a circle: here one made up through a function-level import."""
    (tmp_path / "a.py").write_text("def f():\n    import meta.lv3.sampler\n")
    (tmp_path / "b.py").write_text("from meta.lv3.flat import shard_bounds\n")
    monkeypatch.setitem(MODULES, "meta.lv3.flat", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "meta.lv3.sampler", tmp_path / "b.py")
    real = module_name
    monkeypatch.setattr(sys.modules[__name__], "module_name", lambda p: {
        tmp_path / "a.py": "meta.lv3.flat", tmp_path / "b.py": "meta.lv3.sampler"}.get(p)
        or real(p))
    with pytest.raises(AssertionError, match="meta.lv3.flat <-> meta.lv3.sampler"):
        test_no_import_circles_in_meta()


# mpi4py's methods on communicators, requests and windows (none of meta's own is named so)
MPI_METHODS = {"Accumulate", "Allreduce", "Bcast", "Cancel", "Create_group", "Flush", "Free",
               "Get_group", "Get_tag", "Iallreduce", "Ibarrier", "Irecv", "Isend", "Lock",
               "Lock_all", "Put", "Shared_query", "Shrink", "Split", "Split_type", "Sync", "Test",
               "Testall", "Testany", "Testsome", "Unlock", "Unlock_all", "Wait", "Waitall",
               "Waitany"}


def _raw_mpi(path: Path) -> list[str]:
    """Where ``path`` reaches MPI itself: mpi4py imported, ``_import_mpi`` called, ``MPI.*``,
    an mpi4py method called on a raw handle (``win.Sync()``, ``request.Test()``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in MPI_METHODS):
            found.append(f"line {node.lineno}: .{node.func.attr}()")
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [a.name for a in node.names]
        if any(n.split(".")[0] == "mpi4py" or n == "_import_mpi" for n in names):
            found.append(f"line {node.lineno}: imports {', '.join(names)}")
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "MPI"):
            found.append(f"line {node.lineno}: MPI.{node.attr}")
    return found


def test_mpi_only_in_lv3_comm():
    offenders = [f"{p.relative_to(REPO)} {where}"
                 for p in sorted(set(REPO.glob("meta/**/*.py")) | set(REPO.glob("ops/**/*.py")))
                 if LV3 / "comm" not in p.parents for where in _raw_mpi(p)]
    assert not offenders, "\n".join(offenders)
    assert _raw_mpi(LV3 / "comm" / "communicator.py")  # the check sees it where it is


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["meta", "lv3"] else None


def test_lv3_wings_import_only_what_the_table_allows():
    offenders = []
    for path in sorted(LV3.rglob("*.py")):
        own = _part(module_name(path)) or "__init__"
        if own in ROOT_OF_LV3:
            continue
        assert own in WINGS, f"{path.relative_to(REPO)}: not in WINGS (tests/test_layers.py)"
        for used in sorted(runtime_imports(path)):
            part = _part(used)
            if part is not None and part != own and part not in WINGS[own]:
                offenders.append(f"{path.relative_to(REPO)} imports {used}")
    assert not offenders, "\n".join(offenders)
