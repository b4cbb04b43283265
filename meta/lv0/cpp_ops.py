"""User C++ operators compiled at run time: ``register_cpp_op("Swish", "swish.cpp")``.

The user writes forward and backward in one ``.cpp`` file against ``meta/custom_op.hpp`` (a tensor
view, OpenMP loop helpers and the ``META_OP`` macro that generates the pybind11 module). This
module compiles it with the system C++ compiler, caches the shared library, loads it and
registers an ``Operator`` class around it, so the op runs in graphs, executors and the gradient
checker like any Python op.

Why invoke the compiler directly rather than CMake or setuptools: one command line is fast, has
no build-system dependency at run time, and can be shown verbatim when it fails.

The cache (``$META_CACHE_DIR/cpp_ops``, else ``$XDG_CACHE_HOME/meta/cpp_ops``, else
``~/.cache/meta/cpp_ops``) holds one folder per build key: the hash of the source and every
header it includes by ``#include "..."`` (meta's own headers included), the compiler and its
version, the flags, and the Python and pybind11 versions. A build goes to a temporary file that
is renamed into place, under a file lock, so MPI ranks starting together compile once and
never load a half-written library.

The cache is private: loading a library runs its code, so a library another user could have
written must never be loaded. meta makes the cache folders with mode 0700 and refuses, in one
line (``UnsafeCacheError``), a cache folder, build folder or library that is not this user's,
that others may write, or that is a symbolic link (the cache root itself may be reached through
one the user made). Each user keeps a cache of their own; nothing is shared.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from meta.lv0.operator import Context, Operator
from meta.lv0.registry import UnknownOperatorError, lookup, register, unregister

DEFAULT_DOMAIN = "ai.meta.custom"
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c++17", "-fopenmp", "-fvisibility=hidden",
         "-fdiagnostics-color=never")
HEADER = Path("meta") / "custom_op.hpp"
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


class CppOpBuildError(RuntimeError):
    """The C++ source did not compile (or no compiler was found); the message holds the
    compiler's first errors in the user's file and the command line used."""


class UnsafeCacheError(CppOpBuildError):
    """A cache folder or library another user could have written: meta loads none of it."""


# -- where things are --------------------------------------------------------------------------

def include_dir() -> Path:
    """The folder holding ``meta/custom_op.hpp``.

    An installed wheel ships it as ``meta/include``; an editable checkout has it in
    ``cpp/include``, which is preferred there to the copy the editable install made next to
    ``meta._native`` (that copy goes stale when the header is edited).
    """
    package = Path(__file__).resolve().parents[1]
    candidates = [package / "include", package.parent / "cpp" / "include"]
    spec = importlib.util.find_spec("meta._native")
    if spec and spec.origin:
        candidates.append(Path(spec.origin).parent / "include")
    for folder in candidates:
        if (folder / HEADER).is_file():
            return folder
    raise CppOpBuildError(f"meta's C++ header {HEADER} was not found in "
                          f"{', '.join(map(str, candidates))}; reinstall meta")


def cache_dir() -> Path:
    """Where compiled ops are kept (``$META_CACHE_DIR/cpp_ops`` and fallbacks, see module doc)."""
    if os.environ.get("META_CACHE_DIR"):
        return Path(os.environ["META_CACHE_DIR"]) / "cpp_ops"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "meta" / "cpp_ops"


def _unsafe(path: Path, follow: bool = False) -> str | None:
    """Why ``path`` could hold another user's code: not this user's, writable by others, a
    symbolic link (unless ``follow``); None where it is safe. A folder others may write is
    safe only with the sticky bit (as /tmp: no one renames another's entries)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _refuse(path: Path, problem: str, what: str) -> UnsafeCacheError:
    return UnsafeCacheError(
        f"C++ op cache {what} {path} {problem}: meta loads no library another user could have "
        f"written; set META_CACHE_DIR to a folder of your own (made with mode 0700)")


def private_cache() -> Path:
    """``cache_dir()``, made with mode 0700 where it is missing, after checking that it and the
    folder holding it are this user's and writable by no one else (``UnsafeCacheError``)."""
    root = cache_dir()
    try:
        root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        root.mkdir(exist_ok=True, mode=0o700)
    except OSError as err:
        raise UnsafeCacheError(f"C++ op cache folder {root} cannot be made ({err.strerror}); "
                               f"set META_CACHE_DIR to a writable folder of your own") from err
    for folder in (root.parent, root):  # the parent: no one else may swap the folder out
        if problem := _unsafe(folder, follow=True):
            raise _refuse(folder, problem, "folder")
    return root


def compiler() -> list[str]:
    """The compiler command: ``$CXX`` (may carry a launcher, ``ccache g++``), else c++ or g++."""
    if os.environ.get("CXX"):
        return shlex.split(os.environ["CXX"])
    for name in ("c++", "g++", "clang++"):
        if found := shutil.which(name):
            return [found]
    raise CppOpBuildError("no C++ compiler found: install g++ or set $CXX")


@functools.cache
def _compiler_version(command: tuple[str, ...]) -> str:
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        raise CppOpBuildError(f"the C++ compiler {shlex.join(command)!r} does not run: {err}") \
            from err
    return done.stdout.strip()


# -- building ----------------------------------------------------------------------------------

def _digests(source: Path, include_dirs: Sequence[Path]) -> list[str]:
    """Digests of the source and of every ``#include "..."`` file it reaches (by content, so
    a moved file is still a cache hit; an edited header is a miss)."""
    found: dict[str, str] = {}
    todo = [source]
    while todo:
        path = todo.pop()
        if str(path) in found:
            continue
        text = path.read_bytes()
        found[str(path)] = hashlib.sha256(text).hexdigest()
        for name in _INCLUDE.findall(text.decode(errors="replace")):
            for folder in (path.parent, *include_dirs):
                if (folder / name).is_file():
                    todo.append((folder / name).resolve())
                    break
    return sorted(found.values())


def _diagnostics(stderr: str, source: Path, limit: int = 12) -> str:
    """The compiler's errors trimmed to what matters: each error in the user's file (once per
    location: float and double instantiations repeat them), with the code excerpt and caret
    lines gcc and clang print after it. An error inside a header comes with the line of the
    user's file that instantiated it. At most ``limit`` lines."""
    lines = stderr.splitlines()
    errors = [i for i, line in enumerate(lines) if re.search(r": (fatal )?error:", line)]
    own = [i for i in errors if lines[i].startswith(str(source))]
    if not own:  # the error is in a header: show where the user's code led there
        own = [i for i, line in enumerate(lines) if line.startswith(f"{source}:")
               and "required from" in line][:1] + errors[:1]
    picked: list[str] = []
    seen = set()
    for i in own:
        where = lines[i].split(": ", 1)[0]
        if where in seen:
            continue
        seen.add(where)
        picked.append(lines[i])
        for follow in lines[i + 1:i + 3]:
            if re.match(r"\s+(\d+\s*)?\|", follow):  # "   12 |   code" and "      |   ^~~"
                picked.append(follow)
    return "\n".join((picked or lines[-limit:])[:limit])


def build(source: str | os.PathLike[str], extra_flags: Sequence[str] = ()) -> ModuleType:
    """Compile ``source`` (or take it from the cache) and load it as a Python module.

    The module has ``forward(inputs, attrs)``, ``backward(inputs, outputs, grad_outputs, needs,
    attrs)`` (when the source used ``META_OP``) and ``has_backward``; ``__file__`` is the
    cached library. Raises ``CppOpBuildError`` when the source does not compile.
    """
    path = Path(source).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"C++ op source {path} does not exist")
    import pybind11  # a run-time dependency only for ops compiled at run time

    includes = [include_dir(), Path(pybind11.get_include()),
                Path(sysconfig.get_paths()["include"])]
    cxx = compiler()
    flags = [*FLAGS, *extra_flags]
    if sys.platform == "darwin":
        flags += ["-undefined", "dynamic_lookup"]
    key_parts = {
        "sources": _digests(path, includes[:1]),
        "compiler": [*cxx, _compiler_version(tuple(cxx))],
        "flags": flags,
        "python": [sys.version, sysconfig.get_config_var("EXT_SUFFIX")],
        "pybind11": pybind11.__version__,
    }
    key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"\W", "_", path.stem, flags=re.ASCII)  # a C identifier: PyInit_<name>
    name = f"_meta_op_{stem}_{key}"
    folder = private_cache() / f"{stem}-{key}"
    library = folder / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        if problem := _unsafe(folder):
            raise _refuse(folder, problem, "folder") from None
    if os.path.lexists(library) and (problem := _unsafe(library)):
        raise _refuse(library, problem, "library")
    if not library.is_file():
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # other ranks wait here, then find the library
            if not library.is_file():
                command = [*cxx, *flags, f"-DMETA_OP_MODULE={name}",
                           *(f"-I{d}" for d in includes), str(path)]
                _compile(command, path, library)
                (folder / "build.json").write_text(json.dumps(
                    {**key_parts, "command": command}, indent=1))
    return _load(name, library)


def _compile(command: list[str], source: Path, library: Path) -> None:
    """Run ``command -o <temp>`` and rename the result to ``library`` (atomic on POSIX)."""
    # A fresh name in the private build folder (mode 0700): the umask's permissions are safe.
    temp = str(library.parent / f".build-{os.getpid()}-{secrets.token_hex(4)}{library.suffix}")
    full = [*command, "-o", temp]
    try:
        # LC_ALL=C: diagnostics in English with ASCII quotes, as _diagnostics parses them
        done = subprocess.run(full, capture_output=True, text=True,
                              env={**os.environ, "LC_ALL": "C"})
        if done.returncode != 0:
            raise CppOpBuildError(
                f"could not compile the C++ op {source}:\n{_diagnostics(done.stderr, source)}\n"
                f"command: {shlex.join(full)}")
        os.replace(temp, library)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def _load(name: str, library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- the operator ------------------------------------------------------------------------------

def _plain(op_type: str, name: str, value: Any) -> Any:
    """An attribute as the C++ side reads it: int, float, str or a list of floats."""
    if isinstance(value, (bool, int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, np.ndarray)):
        return [float(v) for v in np.ravel(value)]
    raise TypeError(f"{op_type}: attribute {name!r} is {type(value).__name__}; C++ ops take "
                    f"int, float, str or a list of numbers")


class CppOperator(Operator):
    """Base of the classes ``register_cpp_op`` makes: the C++ kernels behind ``Operator``.

    Forward saves its inputs and outputs for backward; a missing output gradient is passed to
    the kernel as zeros, and the kernel's gradients that it never allocated come back as None.
    """

    module: ModuleType
    source: Path

    def _prepare(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """C-contiguous arrays of one float dtype: the kernel's contract, checked here so the
        error names the op and the input rather than a pybind11 signature."""
        where = f"{self.op_type} (C++ op from {self.source.name})"
        dtypes = set()
        for i, x in enumerate(arrays):
            if x is None:
                raise TypeError(f"{where}: input {i} is absent; C++ ops take only given inputs")
            dtype = np.asarray(x).dtype
            if dtype not in (np.float32, np.float64):
                raise TypeError(f"{where}: input {i} has dtype {dtype}; C++ ops take float32 "
                                f"or float64")
            dtypes.add(dtype)
        if len(dtypes) > 1:
            raise TypeError(f"{where}: inputs mix dtypes {sorted(map(str, dtypes))}; give them "
                            f"one dtype")
        return [np.asarray(x, order="C") for x in arrays]  # 0-d stays 0-d

    def _attrs(self) -> dict[str, Any]:
        return {k: _plain(self.op_type, k, v) for k, v in self.attrs.items()}

    def forward(self, ctx: Context, *inputs: np.ndarray | None) -> Any:
        xs = self._prepare(inputs)
        ys = self.module.forward(xs, self._attrs())
        ctx.save(inputs=xs, outputs=ys)
        return ys[0] if len(ys) == 1 else tuple(ys)

    # -- bound to a plan's buffers (meta.lv1.plan.custom runs these as compiled steps) --------
    def bind_forward(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]
                     ) -> Any | None:
        """The forward kernel bound once to ``inputs`` and to ``outputs`` it writes in place:
        an object whose ``run()`` is the kernel alone (the GIL released, no allocation, no
        copy). None when the library predates binding (then the plan calls ``forward``)."""
        bind = getattr(self.module, "bind_forward", None)
        if bind is None:
            return None
        return bind(self._prepare(inputs), self._prepare(outputs), self._attrs())

    def bind_backward(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                      grad_outputs: Sequence[np.ndarray], needs: Sequence[bool],
                      grad_inputs: Sequence[np.ndarray | None]) -> Any | None:
        """The backward kernel bound the same way: it writes the gradient of input i into
        ``grad_inputs[i]`` (None: not wanted) and reads ``grad_outputs`` (every one given;
        zeros where nothing downstream needs an output)."""
        bind = getattr(self.module, "bind_backward", None)
        if bind is None or not self.module.has_backward:
            return None
        given = [None if g is None else self._prepare([g])[0] for g in grad_inputs]
        return bind(self._prepare(inputs), self._prepare(outputs), self._prepare(grad_outputs),
                    [bool(n) for n in needs], given, self._attrs())

    def backward(self, ctx: Context, *grad_outputs: np.ndarray | None) -> Any:
        if not self.module.has_backward:
            raise NotImplementedError(f"{self.op_type} is not differentiable "
                                      f"({self.source.name} used META_OP_FORWARD_ONLY)")
        dtype = ctx.inputs[0].dtype
        dys = [np.zeros_like(y) if g is None else np.asarray(g, dtype=dtype, order="C")
               for y, g in zip(ctx.outputs, grad_outputs)]
        needs = [ctx.needs(i) for i in range(len(ctx.inputs))]
        return tuple(self.module.backward(ctx.inputs, ctx.outputs, dys, needs, self._attrs()))


def register_cpp_op(
    op_type: str,
    source: str | os.PathLike[str],
    *,
    domain: str = DEFAULT_DOMAIN,
    since: int = 1,
    attributes: dict[str, Any] | None = None,
    backend: str = "numpy",
    extra_flags: Sequence[str] = (),
) -> type[CppOperator]:
    """Compile a C++ operator (cached by source hash) and register it; returns its class.

    ``attributes`` are the node attributes with their defaults, read in C++ with
    ``op.attr("beta")``. With ``backend="numpy"`` the C++ code is the op's only
    implementation; ``backend="native"`` registers it as the twin of a numpy op registered
    already (whose attributes it takes), used by executors built with ``backends=("native",)``.
    Registering the same op again (say, after editing the file) replaces the earlier C++ class.

    >>> import numpy as np, meta
    >>> Swish = meta.register_cpp_op("Swish", "examples/cpp_ops/swish.cpp",
    ...                              attributes={"beta": 1.0})  # doctest: +SKIP
    >>> Swish(beta=2.0).apply(meta.Context(), np.ones(3))      # doctest: +SKIP
    (array([0.88079708, 0.88079708, 0.88079708]),)
    """
    if backend != "numpy":
        try:
            twin = lookup(op_type, since, domain)
        except UnknownOperatorError as err:
            raise ValueError(f"register_cpp_op({op_type!r}, backend={backend!r}): register the "
                             f"numpy implementation first, or use backend='numpy'") from err
        if attributes is not None and set(attributes) != set(twin.attributes):
            raise ValueError(f"{op_type}: attributes {sorted(attributes)} differ from those of "
                             f"its numpy twin {sorted(twin.attributes)}")
        attributes = dict(twin.attributes) if attributes is None else attributes
    module = build(source, extra_flags)
    if not hasattr(module, "forward"):
        raise CppOpBuildError(f"{source} compiled but defines no op: end it with "
                              f"META_OP(forward, backward) or META_OP_FORWARD_ONLY(forward)")
    cls = type(op_type, (CppOperator,), {
        "__doc__": f"{op_type}, C++ kernels compiled from {source}.",
        "__module__": __name__,
        "attributes": dict(attributes or {}),
        "module": module,
        "source": Path(source),
    })
    try:
        previous = lookup(op_type, since, domain, backends=(backend,))
    except UnknownOperatorError:
        previous = None
    if previous is not None and previous.backend == backend and previous.since == since \
            and issubclass(previous, CppOperator):
        unregister(op_type, since, domain, backend)
    return register(op_type, since=since, domain=domain, backend=backend)(cls)
