"""Files written whole or not at all: a temporary file in the target's folder, then a rename.

Every file a run writes (metrics, logs, curves, checkpoints, the exported model, timelines,
benchmark reports) goes through ``atomic_write``: a reader, a crash or a full disk sees either
the previous file or the new one, never half of one, and a failed write leaves no temporary
file behind. A failure is an ``OutputError`` naming the file.

>>> from pathlib import Path; import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> with atomic_write(folder / "a.txt") as f:
...     _ = f.write("hello")
>>> (folder / "a.txt").read_text(), [p.name for p in folder.iterdir()]
('hello', ['a.txt'])
"""

from __future__ import annotations

import os
import secrets
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Iterator


class OutputError(OSError):
    """A run's output file that could not be written (names the file and the reason)."""

    def __init__(self, path: str | os.PathLike, cause: BaseException, note: str = "") -> None:
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        super().__init__(getattr(cause, "errno", None), f"cannot write {path}: {reason}{note}")
        self.path = Path(path)

    def __str__(self) -> str:
        return self.strerror


def _open_temp(tmp: Path, mode: str, **options: Any) -> IO[Any]:
    """A new file at ``tmp`` (created exclusively, permissions as the umask says)."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fdopen(fd, mode, **options)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as err:
        in_the_way = next((p for p in (folder, *folder.parents) if p.is_file()), folder)
        raise NotADirectoryError(err.errno, f"{in_the_way} is a file, not a folder") from err


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", fsync: bool = True,
                 **options: Any) -> Iterator[IO[Any]]:
    """A file object to write ``path`` through (``mode`` "w" or "wb", ``options`` as
    ``open``'s); on leaving the block without error the file is flushed, synced to disk
    (``fsync``) and renamed onto ``path``. On any error, the temporary file is removed and
    ``path`` keeps what it held; an OSError (a full disk, a folder one cannot write to)
    becomes an ``OutputError`` naming ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    created = False
    try:
        _make_folder(path.parent)
        with _open_temp(tmp, mode, **options) as f:
            created = True
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if created:
            with suppress(OSError):
                os.unlink(tmp)
        if isinstance(err, OSError) and not isinstance(err, OutputError):
            raise OutputError(path, err) from err
        raise


def write_text(path: str | os.PathLike, text: str, fsync: bool = True) -> Path:
    """Write ``text`` to ``path`` atomically; returns the path."""
    with atomic_write(path, "w", fsync=fsync) as f:
        f.write(text)
    return Path(path)


def write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_write(path, "wb", fsync=fsync) as f:
        f.write(data)
    return Path(path)
