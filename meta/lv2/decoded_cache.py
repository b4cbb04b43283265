"""A disk cache of decoded arrays, memory-mapped by every process that reads them.

Decoding MNIST (gunzip, then a float32 pass over 188 MB of fresh memory) costs each process
about a second of CPU; an MPI job of n ranks pays it n times, and the test suite starts hundreds
of such processes. The first process that needs an entry builds it and writes it here; every
later one maps the files instead (their pages come from the page cache, shared between the
processes, and cost neither a decode nor memory of their own). Ranks that start together wait
on a lock while the first one builds, instead of all decoding at once.

An entry is one ``.npy`` file per array plus a manifest with each array's dtype, shape and
CRC-32, written last. Every file is written under a temporary name and then renamed, so a reader
sees a whole entry or none. An entry that is missing, truncated, unreadable or whose checksum
disagrees is rebuilt, never used: the cache can make a load faster but never different; a
folder that is not this user's own, or that others may write to, is not used at all. An
entry's name is derived from what it was built from (the caller's key), so a changed source is
a new entry; the same stem's older entries but the latest are then removed. Where the folder
cannot be written (read-only, full), the arrays are built in memory, as without a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: no lock, concurrent first loads each build (and write) it
    fcntl = None  # type: ignore[assignment]

__all__ = ["FORMAT", "cached_arrays"]

FORMAT = 1  # of the files and manifest: a change makes every older entry a miss


def cached_arrays(folder: Path, stem: str, key: str,
                  build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays ``build()`` returns for ``key``: read-only memory maps of the entry in
    ``folder`` when a whole, intact one exists, else built (under a lock, so that processes
    starting together build it once), written there and returned.

    ``stem`` names what is cached (e.g. ``train-normalized``): entries of the same stem with
    another key are stale and are removed when a new one is written. ``key`` must change
    whenever what ``build`` would return changes. Errors of ``build`` propagate unchanged.
    """
    name = f"{stem}-{hashlib.sha256(f'{FORMAT}:{key}'.encode()).hexdigest()[:20]}"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(folder):
            return build()
    except OSError:
        return build()
    if (hit := _read(folder, name)) is not None:
        return hit
    try:
        lock = open(folder / f".{stem}.lock", "ab")  # noqa: SIM115 (closed below)
    except OSError:
        return build()
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (hit := _read(folder, name)) is not None:  # built while this process waited
            return hit
        arrays = build()
        try:
            _prune(folder, stem, name)
            _write(folder, name, stem, arrays)
        except OSError:
            pass  # cannot be written: this process has its arrays all the same
        return arrays


def _private(folder: Path) -> bool:
    """Whether only this user can have written the folder's entries: it is this user's own and
    nobody else may write to it. Another user's entry could hold different, well-formed data,
    which no checksum in the entry itself would reveal."""
    if not hasattr(os, "getuid"):
        return True
    info = folder.lstat()
    return (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
            and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _read(folder: Path, name: str) -> dict[str, np.ndarray] | None:
    try:
        manifest = json.loads((folder / f"{name}.json").read_text())
        if manifest["format"] != FORMAT:
            return None
        arrays = {}
        for key, info in manifest["arrays"].items():
            array = np.load(folder / f"{name}.{key}.npy", mmap_mode="r", allow_pickle=False)
            if (str(array.dtype) != info["dtype"] or list(array.shape) != info["shape"]
                    or not array.flags.c_contiguous or zlib.crc32(array) != info["crc32"]):
                return None
            arrays[key] = np.asarray(array)  # a plain read-only ndarray over the mapping
        return arrays
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def _write(folder: Path, name: str, stem: str, arrays: dict[str, np.ndarray]) -> None:
    entries = {}
    for key, array in arrays.items():
        array = np.ascontiguousarray(array)
        _replace(folder, stem, f"{name}.{key}.npy",
                 lambda f, a=array: np.save(f, a, allow_pickle=False))
        entries[key] = {"dtype": str(array.dtype), "shape": list(array.shape),
                        "crc32": zlib.crc32(array)}
    manifest = json.dumps({"format": FORMAT, "arrays": entries}).encode()
    _replace(folder, stem, f"{name}.json", lambda f: f.write(manifest))


def _replace(folder: Path, stem: str, filename: str, write: Callable) -> None:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}-", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, folder / filename)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _prune(folder: Path, stem: str, name: str) -> None:
    """Before entry ``name`` of ``stem`` is written (over any damaged one of that name): remove
    the stem's other entries but the most recently written one, and the temporary files of
    writers that died (under the stem's lock no writer of it is alive). One other entry stays
    so that two sources of the same name used in turn (the real MNIST, and a test's tiny files
    named MNIST) do not remove each other's at every switch; any more are a changed source's
    stale ones. A process still mapping a removed file keeps it."""
    entry = re.compile(rf"({re.escape(stem)}-[0-9a-f]{{20}})\.")
    entries: dict[str, list[Path]] = {}
    for path in folder.iterdir():
        if match := entry.match(path.name):
            entries.setdefault(match[1], []).append(path)
        elif path.name.startswith(f".{stem}-") and path.name.endswith(".part"):
            path.unlink(missing_ok=True)

    def written(other: str) -> float:
        try:
            return (folder / f"{other}.json").stat().st_mtime
        except OSError:  # no manifest: an incomplete entry, the first to go
            return float("-inf")

    entries.pop(name, None)
    for older in sorted(entries, key=written)[:-1]:
        for path in entries[older]:
            path.unlink(missing_ok=True)
