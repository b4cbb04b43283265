"""How a training step updates the model: the seam between the trainer and what steps.

Chainer's ``StandardUpdater`` is the model. The trainer runs the loop (batches, events,
evaluation) and asks its updater for everything about an update: a step on a batch's feeds
(``step``: one gradient, or as many as a line search needs through a closure), a step on rows
of the training data evaluated elsewhere (``step_rows``, where ``evaluates_rows``), the
replicas' state made to agree before evaluating (``sync_state``) and metric sums added up over
replicas (``sum_across``). ``Updater`` is the one-process policy over any Level 2 optimizer; a
Level 3 strategy hands the trainer its own (``Strategy.updater()``), so the trainer never asks
an optimizer what it can do.

>>> import numpy as np
>>> from meta.lv2.optimizers import Optimizer, sgd
>>> updater = Updater(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
>>> updater.evaluates_rows, updater.sum_across(np.array([2.0, 3.0])).tolist()
(False, [2.0, 3.0])
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np


def _identity(values: np.ndarray) -> np.ndarray:
    return values


class Updater:
    """Steps ``optimizer`` (its ``needs_closure`` says whether it line-searches) on one
    process; metric sums are summed by ``sum_across`` (the identity by default).

    ``executor`` is the executor the trainer should run under this updater (None: the one it
    was built with; a model-parallel strategy brings its own) and ``timeline`` where that
    executor records its phases (None: nowhere).
    """

    evaluates_rows = False  # step_rows, not step: the rows are evaluated where the data is

    def __init__(self, optimizer: Any,
                 sum_across: Callable[[np.ndarray], np.ndarray] | None = None,
                 executor: Any = None, timeline: Any = None) -> None:
        self.optimizer, self.executor, self.timeline = optimizer, executor, timeline
        self._sum_across = sum_across or _identity

    def step(self, executor: Any, feeds: dict[str, np.ndarray], loss: str,
             outputs: Iterable[str]) -> dict[str, np.ndarray]:
        """One update on this batch; returns the values (``loss``, ``outputs``) before it.

        Line-search optimizers (L-BFGS, CG) evaluate the batch as often as they need through a
        closure; others take the gradients of one evaluation.
        """
        first: list[dict[str, np.ndarray]] = []

        def closure() -> tuple[float, dict[str, np.ndarray]]:
            values, grads = executor.inference_and_backprop(feeds, loss=loss,
                                                            outputs=list(outputs))
            if not first:
                first.append(values)
            return float(values[loss]), grads

        if self.optimizer.needs_closure:
            self.optimizer.step(closure)
        else:
            self.optimizer.step(closure()[1])
        return first[0]

    def step_rows(self, indices: np.ndarray) -> tuple[float, int]:
        """(mean loss, count correct) of these rows of the training data at the parameters
        before the update, which they drive; only where ``evaluates_rows``."""
        raise TypeError(f"{type(self).__name__}: {type(self.optimizer).__name__} steps on a "
                        "batch's gradients, not on rows evaluated elsewhere (step_rows)")

    def sync_state(self, executor: Any) -> None:
        """Make the replicas' persistent state (``executor.graph.state``: running statistics)
        agree before evaluating: one process has nothing to agree with."""

    def sum_across(self, values: np.ndarray) -> np.ndarray:
        """``values`` (metric sums) added up over the replicas."""
        return self._sum_across(values)
