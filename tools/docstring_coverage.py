"""The share of meta's public definitions that have a docstring, for ``meta/`` and ``ops/``.

Usage: ``python tools/docstring_coverage.py [--missing PREFIX]``. A public definition is a
module without an underscored part in its name, and in it each class and function whose name
has no leading underscore and that the module itself defines, and each public method (or
property) a public class defines. A docstring counts as ``inspect.getdoc`` finds it, so a
method inherits its base class's (``forward`` from ``Operator.forward``), as ``help()`` and the
API reference show it. ``--missing meta.lv0`` lists the undocumented ones under that name.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
