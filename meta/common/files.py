"""Files written whole or not at all: a temporary file in the target's folder, then a rename.

Every file a run writes (metrics, logs, curves, checkpoints, the exported model, timelines,
benchmark reports) goes through ``atomic_write``: a reader, a crash or a full disk sees either
the previous file or the new one, never half of one, and a failed write leaves no temporary
file behind. A failure is an ``OutputError`` naming the file.

The files a run reads are found in one place too: ``find_input`` resolves a recipe's relative
paths beside the recipe first, then in the working directory.

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
from typing import IO, Any, Iterator, Sequence


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


class MissingInput(FileNotFoundError):
    """An input file or folder found in none of the places it was looked for; the message
    names the path as given and each place (``find_input``)."""

    def __init__(self, path: str | os.PathLike, looked: Sequence[tuple[Path, str]]) -> None:
        places = " and ".join(f"{p}{f' ({why})' if why else ''}" for p, why in looked)
        super().__init__(2, f"{str(path)!r} not found: looked for {places}")
        self.path, self.looked = str(path), [p for p, _ in looked]

    def __str__(self) -> str:
        return self.strerror


def find_input(path: str | os.PathLike, folders: Sequence[tuple[Path, str]]) -> Path:
    """The file or folder ``path`` names: itself when absolute (``~`` expanded), else the
    first of ``folders`` ((folder, why) pairs, e.g. the recipe's folder, then the working
    directory) that holds it. A recipe's relative ``files`` or ``path`` thus means the file
    beside the recipe wherever ``meta run`` is started, as a script's import does. Raises
    ``MissingInput`` naming every place looked at.

    >>> import tempfile; folder = Path(tempfile.mkdtemp()); _ = (folder / "a.txt").write_text("")
    >>> find_input("a.txt", [(folder, "beside the recipe")]) == folder / "a.txt"
    True
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        if given.exists():
            return given
        raise MissingInput(path, [(given, "")])
    looked: list[tuple[Path, str]] = []
    for folder, why in folders:
        candidate = Path(folder).absolute() / given
        if candidate.exists():
            return candidate
        if all(candidate != seen for seen, _ in looked):
            looked.append((candidate, why))
    raise MissingInput(path, looked)
