"""The recipe's metric components (top-k accuracy, a class's recall, ...), measured after
training by the ranks that train and shared with every rank."""

from __future__ import annotations

import pickle
from typing import Any, Mapping

import numpy as np

from meta.lv2 import METRICS, Trainer
from meta.lv3 import Communicator
from meta.run.errors import user_code, user_error
from meta.run.recipe import Threshold


def measure(metrics: Mapping[str, Threshold], trainer: Trainer, history: list[dict[str, Any]],
            trains: bool, comm: Communicator
            ) -> tuple[dict[str, float], BaseException | None]:
    """The values of the recipe's ``metrics`` that are metric components, computed where the
    rank ``trains`` and broadcast from rank 0 (a collective where any is wanted); and the
    first metric that raised or returned no number (its metric is then missing: the run is
    not passed), or None."""
    wanted = {k: t for k, t in metrics.items() if k in METRICS}
    values: dict[str, float] = {}
    failed: BaseException | None = None
    if trains:
        for key, threshold in wanted.items():
            try:
                with user_code(f"metric {key!r}", f"METRICS[{key!r}]", "after training"):
                    values[key] = _number(METRICS[key].build(**threshold.options)
                                          .compute(trainer, history))
            except Exception as err:  # noqa: BLE001 - reported once the outputs are out
                failed = failed or err
    if not wanted:
        return {}, None
    values, failed = comm.bcast_obj((values, _portable(failed)), root=0)
    return values, failed


def _number(value: Any) -> float:
    """A metric's value as a float; anything else names what it was."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            and not (isinstance(value, np.ndarray) and value.size == 1):
        raise TypeError(f"compute() returned {type(value).__name__} {value!r}, not a number")
    return float(value)


def _portable(err: BaseException | None) -> BaseException | None:
    """``err`` as it can travel to other ranks (pickled): the marked original when it
    pickles, else its one-line UserCodeError text."""
    if err is None:
        return None
    user = user_error(err)
    try:
        pickle.dumps(err)
        return err
    except Exception:  # noqa: BLE001 - unpicklable user exceptions
        return RuntimeError(str(user or err))
