"""The operator registry: (domain, op type) and opset version to an implementation per backend.

``@register("Gemm", since=11)`` records a class as the implementation of ONNX ``Gemm`` for
opsets 11 and up (until a later ``since`` of the same op). A backend other than ``"numpy"``
(``"native"`` for C++ kernels) registers a twin behind the same interface; executors ask for the
backends they prefer and fall back to numpy.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterator, Sequence, TypeVar

from meta.lv0.operator import Operator

OpClass = TypeVar("OpClass", bound=type[Operator])

DEFAULT_BACKENDS: tuple[str, ...] = ("numpy",)


class UnknownOperatorError(LookupError):
    """No implementation for an (op type, domain, opset) triple."""


@dataclass(frozen=True)
class Entry:
    domain: str
    op_type: str
    since: int
    backend: str
    cls: type[Operator]

    @property
    def name(self) -> str:
        """The entry as messages show it: ``domain::OpType-since[backend]`` (no domain for
        ai.onnx)."""
        domain = f"{self.domain}::" if self.domain else ""
        return f"{domain}{self.op_type}-{self.since}[{self.backend}]"


_REGISTRY: dict[tuple[str, str], dict[int, dict[str, type[Operator]]]] = {}
_LIBRARIES: set[str] = set()  # operator libraries imported by load_library
_FILES: dict[str, ModuleType] = {}  # ... and the files it loaded, by resolved path


def register(
    op_type: str, since: int = 1, domain: str = "", backend: str = "numpy"
) -> Callable[[OpClass], OpClass]:
    """Class decorator that registers an operator implementation."""

    def decorate(cls: OpClass) -> OpClass:
        if not (isinstance(cls, type) and issubclass(cls, Operator)):
            raise TypeError(f"@register({op_type!r}) needs an Operator subclass, got {cls!r}")
        key = (_default_domain(domain), op_type)
        if not _is_builtin(cls):
            # ``import meta`` loaded the library (load_library), so a user's op clashing with a
            # built-in is refused here, before anything changes.
            builtin = _builtin_of(key)
            if builtin is not None:
                raise ValueError(
                    f"operator {op_type!r} (domain {domain or 'ai.onnx'!r}) is built in "
                    f"({builtin.__module__}.{builtin.__qualname__}); register yours under a "
                    f"domain of your own, e.g. @register({op_type!r}, domain='my.ops')")
        old = _REGISTRY.get(key, {}).get(since, {}).get(backend)
        if old is not None and old is not cls:
            raise ValueError(
                f"operator {op_type!r} (domain {domain!r}, since opset {since}, backend "
                f"{backend!r}) is already registered by {old.__module__}.{old.__qualname__}"
            )
        cls.op_type, cls.domain, cls.since, cls.backend = op_type, key[0], since, backend
        _REGISTRY.setdefault(key, {}).setdefault(since, {})[backend] = cls
        return cls

    return decorate


@contextmanager
def scratch() -> Iterator[None]:
    """Registrations made inside are forgotten on exit (tests, notebooks trying an op out)."""
    global _REGISTRY
    saved, files = _REGISTRY, dict(_FILES)
    _REGISTRY = {key: {since: dict(impls) for since, impls in versions.items()}
                 for key, versions in saved.items()}
    try:
        yield
    finally:
        _REGISTRY = saved
        _FILES.clear()  # a file loaded inside registers again when loaded after
        _FILES.update(files)


def unregister(op_type: str, since: int = 1, domain: str = "", backend: str = "numpy") -> None:
    """Remove one registration (tests and notebooks that redefine an operator)."""
    domain = _default_domain(domain)
    versions = _REGISTRY.get((domain, op_type), {})
    impls = versions.get(since, {})
    if backend not in impls:
        raise KeyError(f"operator {op_type!r} (domain {domain!r}, since {since}, backend "
                       f"{backend!r}) is not registered")
    del impls[backend]
    if not impls:
        del versions[since]
    if not versions:
        del _REGISTRY[(domain, op_type)]


def _default_domain(domain: str) -> str:
    """ONNX spells the default domain both "" and "ai.onnx"; the registry keys it as ""."""
    return "" if domain == "ai.onnx" else domain


def _is_builtin(cls: type) -> bool:
    """Whether ``cls`` belongs to meta's operator library (the ``meta.ops`` package)."""
    return cls.__module__ == "meta.ops" or cls.__module__.startswith("meta.ops.")


def _builtin_of(key: tuple[str, str]) -> type[Operator] | None:
    """A built-in implementation registered under ``key``, if there is one."""
    for impls in _REGISTRY.get(key, {}).values():
        for cls in impls.values():
            if _is_builtin(cls):
                return cls
    return None


def load_library(package: str = "meta.ops") -> ModuleType:
    """Import an operator library: a package whose modules ``@register`` operators, or a Python
    file that does (``load_library("my_ops.py")``, what ``meta check-op --module`` loads).
    meta's own (``meta.ops``) is loaded by ``import meta``, in plain sight in
    ``meta/__init__.py``; a library of yours is loaded the same way, once (a second call returns
    the module loaded the first time)."""
    if package.endswith(".py") or os.sep in package:
        return _load_file(Path(package))
    if package not in _LIBRARIES:
        _LIBRARIES.add(package)
        try:
            importlib.import_module(package)
        except BaseException:
            _LIBRARIES.discard(package)
            raise
    return sys.modules[package]


def _load_file(path: Path) -> ModuleType:
    """A Python file imported under its own name, its folder importable while it loads (as
    ``python file.py`` would have it); under another name if a module already has that one."""
    key = str(path.resolve())
    if key in _FILES:
        return _FILES[key]
    if not path.is_file():
        raise FileNotFoundError(f"operator library {str(path)!r}: no such file")
    name = path.stem if path.stem not in sys.modules else f"_meta_library_{len(_FILES)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"operator library {str(path)!r}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(folder)
    _FILES[key] = module
    return module


def lookup(
    op_type: str, opset: int, domain: str = "", backends: Sequence[str] = DEFAULT_BACKENDS
) -> type[Operator]:
    """The implementation of ``op_type`` for a model importing ``opset`` of ``domain``.

    Picks the newest registration with ``since <= opset``, then the first of ``backends`` that
    has it, then numpy.
    """
    domain = _default_domain(domain)
    versions = _REGISTRY.get((domain, op_type))
    where = f"op {op_type!r} (domain {domain or 'ai.onnx'!r}, opset {opset})"
    if not versions:
        raise UnknownOperatorError(f"{where}: no such operator is registered")
    usable = [v for v in versions if v <= opset]
    if not usable:
        first = min(versions)
        raise UnknownOperatorError(f"{where}: implemented only from opset {first} on")
    impls = versions[max(usable)]
    for backend in (*backends, "numpy"):
        if backend in impls:
            return impls[backend]
    raise UnknownOperatorError(f"{where}: no implementation for backends {list(backends)}")


def entries() -> Iterator[Entry]:
    """Every registered implementation, sorted by op type, version and backend."""
    for (domain, op_type), versions in sorted(_REGISTRY.items()):
        for since, impls in sorted(versions.items()):
            for backend, cls in sorted(impls.items()):
                yield Entry(domain, op_type, since, backend, cls)


def load_operator_file(path: str) -> tuple[Any, str]:
    """(the module, "") for ``--module FILE``, a user's file that registers operators, or
    (None, the one-line reason it could not be imported)."""
    if not path.endswith(".py"):
        return None, f"--module {path}: not a Python file (.py)"
    try:
        return load_library(path), ""
    except (OSError, SyntaxError, ImportError) as err:  # the file itself cannot be imported
        return None, f"--module {path}: cannot import it ({type(err).__name__}: {err})"
    except Exception as err:  # the user's code raised while it ran: said in one line
        from meta.common.user_code import UserCodeError

        return None, str(UserCodeError(f"--module {path}", "", "on import", err))
