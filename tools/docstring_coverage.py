"""The share of meta's public definitions that have a docstring, for ``meta/`` and ``ops/``,
and of public attributes, per package.

Usage: ``python tools/docstring_coverage.py [--missing PREFIX] [--attributes PREFIX]``. A
public definition is a module without an underscored part in its name, and in it each class
and function whose name has no leading underscore and that the module itself defines, and each
public method (or property) a public class defines. A docstring counts as ``inspect.getdoc``
finds it, so a method inherits its base class's (``forward`` from ``Operator.forward``), as
``help()`` and the API reference show it. ``--missing meta.lv0`` lists the undocumented ones
under that name.

A public attribute is a name without a leading underscore that a public class assigns in its
body (a dataclass field, a class constant) or as ``self.NAME`` in its ``__init__``: what a
user of an instance reads (a strategy's ``flat_params``, ``bytes_sent``). It is documented
by a string literal right after the assignment, as pdoc reads it into the API reference (and
as PEP 257 calls an attribute docstring), here or in a base class that assigns the same name
(a subclass's ``name`` or ``consistent`` inherits ``Strategy``'s, as a method inherits its
docstring); a comment does not count, since neither ``help()`` nor the reference shows it.
``--attributes meta.lv3`` prints the share under that name and lists the undocumented ones.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {"meta.lv1.torch_ops"}  # imports torch; see tools/build_api_docs.py


def _modules() -> list:
    import meta

    found = [meta]
    for info in pkgutil.walk_packages(meta.__path__, prefix="meta."):
        if info.name in SKIPPED or any(p.startswith("_") for p in info.name.split(".")):
            continue
        found.append(importlib.import_module(info.name))
    return found


def definitions() -> list[tuple[str, str, bool]]:
    """(area "meta" or "ops", qualified name, documented) for each public definition."""
    out = []
    seen = set()
    for module in _modules():
        path = Path(inspect.getfile(module)).resolve()
        if path in seen:  # meta.ops and its alias reach the same files
            continue
        seen.add(path)
        area = "ops" if path.parent.name == "ops" else "meta"
        name = module.__name__
        out.append((area, name, bool(inspect.getdoc(module))))
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj):
                out.append((area, f"{name}.{attr}", bool(obj.__doc__ and obj.__doc__.strip())))
                for meth, member in vars(obj).items():
                    if meth.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if inspect.isfunction(member) or isinstance(member, property):
                        doc = inspect.getdoc(getattr(obj, meth, member)) \
                            if not isinstance(member, property) else member.__doc__
                        out.append((area, f"{name}.{attr}.{meth}", bool(doc)))
            elif inspect.isfunction(obj):
                out.append((area, f"{name}.{attr}", bool(inspect.getdoc(obj))))
    return out


@functools.cache
def class_attributes(cls: type) -> list[tuple[str, bool]]:
    """(name, documented) of each public attribute ``cls`` itself assigns: in its body, or
    as ``self.NAME`` anywhere in its ``__init__`` (in an ``if`` too), once each; documented
    where any of its assignments is followed by a string literal."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return []
    node = tree.body[0]
    found: dict[str, bool] = {}

    def scan(body: list[ast.stmt], instance: bool) -> None:
        for i, st in enumerate(body):
            targets = st.targets if isinstance(st, ast.Assign) else \
                [st.target] if isinstance(st, ast.AnnAssign) else []
            targets = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
            if instance:
                names = [t.attr for t in targets if isinstance(t, ast.Attribute)
                         and isinstance(t.value, ast.Name) and t.value.id == "self"]
            else:
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            after = body[i + 1] if i + 1 < len(body) else None
            documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str)
            for name in names:
                if not name.startswith("_"):
                    found[name] = found.get(name, False) or documented
            if instance:
                for field in ("body", "orelse", "finalbody"):
                    inner = getattr(st, field, None)
                    if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                        scan(inner, True)
                for handler in getattr(st, "handlers", []) or []:
                    scan(handler.body, True)

    if isinstance(node, ast.ClassDef):
        scan(node.body, False)
        for st in node.body:
            if isinstance(st, ast.FunctionDef) and st.name == "__init__":
                scan(st.body, True)
    return list(found.items())


def attributes(prefix: str = "meta") -> list[tuple[str, bool]]:
    """(qualified name, documented) of each public attribute of each public class defined
    in a public module under ``prefix``."""
    out = []
    seen = set()
    for module in _modules():
        name = module.__name__
        if not (name == prefix or name.startswith(prefix + ".")):
            continue
        path = Path(inspect.getfile(module)).resolve()
        if path in seen:
            continue
        seen.add(path)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not inspect.isclass(obj) or \
                    getattr(obj, "__module__", None) != name or obj.__name__ != attr:
                continue  # private, imported, or an alias (counted under its own name)
            inherited = {a for base in obj.__mro__[1:] for a, doc in class_attributes(base)
                         if doc}
            out += [(f"{name}.{attr}.{a}", doc or a in inherited)
                    for a, doc in class_attributes(obj)]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    defs = definitions()
    for area in ("meta", "ops"):
        mine = [d for d in defs if d[0] == area]
        done = sum(d[2] for d in mine)
        print(f"{area}/: {done} of {len(mine)} public definitions documented "
              f"({100 * done / max(len(mine), 1):.0f} %)")
    if "--missing" in argv:
        prefix = argv[argv.index("--missing") + 1]
        for _, qualname, documented in defs:
            if not documented and qualname.startswith(prefix):
                print(f"  missing: {qualname}")
    if "--attributes" in argv:
        prefix = argv[argv.index("--attributes") + 1]
        found = attributes(prefix)
        done = sum(d for _, d in found)
        print(f"{prefix}: {done} of {len(found)} public attributes documented "
              f"({100 * done / max(len(found), 1):.0f} %)")
        for qualname, documented in found:
            if not documented:
                print(f"  missing: {qualname}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
