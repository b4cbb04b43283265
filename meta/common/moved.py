"""Old import paths kept working for one release after a module or a name moved.

``alias_modules(package, moved)`` makes ``package.<old>`` import as the module now at
``package.<new>`` (the same module object, so its classes and registries stay one, as numpy's
and scipy's deprecations alias ``sys.modules``); ``forward_names(package, home)`` gives a
package that took the place of a module the old module's other names, from ``home``. Both
warn with a ``DeprecationWarning`` naming the new place. Nothing of meta is imported here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Mapping


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``package.<old>`` for every old name of ``moved`` (old -> new, both relative to
    ``package``, or new absolute when it starts with ``meta.``: a module that moved to another
    level) and loads it as the new module, warning once (then ``sys.modules`` has it)."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package, self.moved = package, dict(moved)

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        old = fullname.removeprefix(f"{self.package}.")
        if old == fullname or old not in self.moved:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder: exec_module puts the real module in its place

    def exec_module(self, module: ModuleType) -> None:
        new = absolute(self.package, self.moved[module.__name__.removeprefix(self.package + '.')])
        warnings.warn(f"{module.__name__} moved to {new}; the old name goes in the next "
                      "release", DeprecationWarning, stacklevel=2)
        # the import system returns whatever sys.modules holds under the name once this ends
        sys.modules[module.__name__] = importlib.import_module(new)


def absolute(package: str, new: str) -> str:
    """A ``moved`` entry's module name: relative to ``package``, or absolute (``meta.``...)."""
    return new if new.startswith("meta.") else f"{package}.{new}"


def alias_modules(package: str, moved: Mapping[str, str]) -> None:
    """Let ``package.<old>`` import as ``package.<moved[old]>`` (installed once per package)."""
    if not any(isinstance(f, _MovedModules) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(package, moved))


def forward_names(package: str, home: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``, which took the place of a module of the same
    name: a name the package lacks is the old module's, now in module ``home``."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's own name
        if not name.startswith("__"):
            module = importlib.import_module(home)
            if hasattr(module, name):
                warnings.warn(f"{package}.{name} moved to {home}.{name}; the old name goes "
                              "in the next release", DeprecationWarning, stacklevel=2)
                return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
