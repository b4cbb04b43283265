"""The part of the error boundary (``meta.run.errors``) that runs inside training: ``user_code``
marks an exception raised by code the user brought (an event, a metric, a dataset) with what
raised it and when, and ``UserCodeError`` words it in one line. It imports nothing of meta, so
the trainer (Level 2) can use it while ``meta.run.errors``, which knows every level's one-line
errors, stays above the levels."""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from typing import Iterator


class UserCodeError(Exception):
    """An exception from user-supplied code, with what raised it and when.

    ``component`` names it (``event 'Boom'``), ``key`` is where the recipe names it
    (``events``), ``when`` where the run was (``at epoch 1, step 4``); ``error`` is the
    original exception, whose traceback ``details`` keeps."""

    def __init__(self, component: str, key: str, when: str, error: BaseException,
                 kind: type[BaseException] | None = None) -> None:
        self.component, self.key, self.when, self.error = component, key, when, error
        text = " ".join(str(error).split()) or "(no message)"
        where = f" ({key})" if key else ""
        at = f" {when}" if when else ""
        kind = kind or type(error)  # what the user's code raised, if meta re-raised it
        super().__init__(f"{component}{where} raised {kind.__name__}{at}: {text}")
        self.details = "".join(traceback.format_exception(error))


MARK = "_meta_raised_in"  # the attribute ``user_code`` sets on an exception it saw


@contextmanager
def user_code(component: str, key: str = "", when: str = "") -> Iterator[None]:
    """Run the block as user code: an exception it raises keeps its type (callers of the
    library still catch ``KeyError``), marked with what raised it and when, so that
    ``user_error`` at the command's boundary can word it in one line. The innermost mark
    wins: an event's metric that raised is named as the metric."""
    try:
        yield
    except Exception as err:
        if not hasattr(err, MARK):  # meta's own one-line errors pass through user_error
            setattr(err, MARK, (component, key, when))
        raise
