"""The error boundary around code the user brought: a recipe's own datasets, models, events,
metrics, strategies, operators and optimizers.

An exception raised inside such code is a mistake in what the user brought, not a bug of
meta: ``meta run`` turns it into one line naming the component, the recipe key and where the
run was (``UserCodeError``), exits 2, and keeps the full traceback in the output folder's
``error.log`` (shown with ``--debug``), as PyTorch Lightning names the hook that raised.

Errors meta already words in one line (``ONE_LINE``: a refused option, a corrupt file, a NaN
loss, a full disk) pass through unchanged, and so do errors of MPI and interrupts: they have
their own handling.

>>> try:
...     with user_code("metric 'top5'", "METRICS['top5']", "after training"):
...         float("high")
... except ValueError as err:
...     print(user_error(err))
metric 'top5' (METRICS['top5']) raised ValueError after training: could not convert string \
to float: 'high'
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

# the part of the boundary that the trainer (Level 2) uses lives below the levels; re-exported
from meta.common.user_code import MARK, UserCodeError, user_code

ERROR_LOG = "error.log"


def one_line_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meta already reports in one line; the boundary lets them through."""
    from meta.common.component import ComponentError
    from meta.common.files import OutputError
    from meta.lv0 import BackwardError
    from meta.lv1 import GraphError
    from meta.lv2 import CheckpointError, DatasetError

    return (UserCodeError, ComponentError, OutputError, BackwardError, GraphError,
            CheckpointError, DatasetError, FloatingPointError)


def _passes_through(err: BaseException) -> bool:
    """Whether ``err`` keeps its own handling: meta's one-line errors, and MPI's (a rank that
    died is the survival code's to report)."""
    if isinstance(err, one_line_errors()):
        return True
    return type(err).__module__.startswith("mpi4py")


def user_error(err: BaseException) -> UserCodeError | None:
    """The ``UserCodeError`` for an exception ``user_code`` marked, else None."""
    if isinstance(err, UserCodeError):
        return err
    if _passes_through(err):  # worded already, or MPI's: the user_code mark does not apply
        return None
    mark = getattr(err, MARK, None)
    return UserCodeError(*mark, err) if mark else None


def raised_in_user_file(err: BaseException, user_dirs: list[Path]) -> UserCodeError | None:
    """A ``UserCodeError`` for ``err`` when the innermost frame of its traceback that is not a
    library's (numpy's, Python's) lies under one of ``user_dirs`` (the recipe's folder) rather
    than in meta: an operator, optimizer or strategy the user wrote raised while meta ran it.
    None when meta's own code raised last (a bug, which keeps its traceback)."""
    if _passes_through(err) or not user_dirs:
        return None
    package = Path(__file__).resolve().parents[1]  # meta/, this file being meta/run/errors.py
    ours = (str(package), str(package.parent / "ops"))
    users = tuple(str(Path(d).resolve()) for d in user_dirs)
    # numpy's and Python's own frames are skipped, even in a virtual environment kept in the
    # recipe's folder
    library = tuple(str(Path(p).resolve()) for p in
                    {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.__file__)})
    cause: BaseException | None = err
    while cause is not None:  # an executor's error naming the node, from the user's kernel
        where = _innermost(cause, ours, library, users)
        if where == "meta":
            return None
        if where:
            return UserCodeError(f"user code at {where}", "", "", err, type(cause))
        cause = cause.__cause__
    return None


def _innermost(err: BaseException, ours: tuple[str, ...], library: tuple[str, ...],
               users: tuple[str, ...]) -> str:
    """Where the innermost frame of ``err``'s own traceback that is not a library's lies:
    "file:line in function()" under ``users``, "meta" in meta, "" elsewhere. An error raised
    by meta with the user's error as its cause (``raise ... from err``) is then looked up
    through that cause."""
    frames = traceback.extract_tb(err.__traceback__)
    for frame in reversed(frames):
        filename = str(Path(frame.filename).resolve())
        if filename.startswith(ours):
            return "" if err.__cause__ is not None and frame is frames[-1] else "meta"
        if filename.startswith(library) or "site-packages" in Path(filename).parts:
            continue
        if filename.startswith(users):
            return f"{Path(filename).name}:{frame.lineno} in {frame.name}()"
    return ""


def keep_traceback(folder: Path | None, err: BaseException) -> Path | None:
    """Append ``err``'s full traceback to ``folder/error.log``; the path, or None when the
    folder does not exist (nothing was created for a run that never started)."""
    if folder is None or not Path(folder).is_dir():
        return None
    path = Path(folder) / ERROR_LOG
    details = getattr(err, "details", None) or "".join(traceback.format_exception(err))
    try:
        with open(path, "a") as f:
            f.write(details)
    except OSError:
        return None
    return path


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM ended the run; ``exit_code`` is 128 + the signal (130, 143), as a
    shell reports it, and ``where`` says where training stopped and what was saved."""

    def __init__(self, signum: int, where: str = "") -> None:
        super().__init__(signum)
        self.signum, self.where = signum, where
        self.exit_code = 128 + signum
        self.name = signal.Signals(signum).name


class SignalGuard:
    """SIGINT and SIGTERM for the length of a ``with`` block. While a trainer runs
    (``deferring``), the first signal is only noted (``pending``): the trainer stops at the next
    step boundary, where a checkpoint is consistent (``meta.run.runner.StopOnSignal``); a second
    signal, or one outside training, raises ``Interrupted`` at once. Outside the main thread
    (where Python allows no handler) nothing changes."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.deferring = False
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.deferring and self.pending is None:
            self.pending = signum
            return
        raise Interrupted(signum)

    def __enter__(self) -> SignalGuard:
        self.pending, self.deferring = None, False
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                break
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous.clear()
        self.deferring = False


SIGNALS = SignalGuard()  # the process's one guard (meta run installs it)
