"""Sandblaster's rows: what a worker evaluates (a loss sum, gradient sums and a count correct
over rows of the batch), from a function or from a run's training data and executor (its
``Workload``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

import numpy as np

from meta.lv2.optimizers import Params
from meta.lv3.workload import Workload


class Evaluation(NamedTuple):
    """A portion's sums: loss summed over its rows, gradients of that sum, count correct."""

    loss_sum: float
    """The rows' summed loss."""
    grads: Params
    """The gradient of the summed loss, per parameter."""
    correct: int
    """Rows classified correctly."""


class RowsEvaluator(Protocol):
    """Evaluates rows (indices below ``examples``) of a dataset at the current parameters."""

    examples: int
    """Rows in the training data (the indices it takes are below this)."""

    def __call__(self, rows: np.ndarray) -> Evaluation: ...


class RowsFunction:
    """A ``RowsEvaluator`` from a function of the rows."""

    def __init__(self, function: Callable[[np.ndarray], Evaluation], examples: int) -> None:
        self.function, self.examples = function, examples
        """``function``: rows, parameters -> (summed loss, gradients). ``examples``: rows in the
        data."""

    def __call__(self, rows: np.ndarray) -> Evaluation:
        return self.function(rows)


class TrainingRows:
    """Rows of a run's training data through its executor (a mean loss graph)."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        """The run's graph, data and names the rows are evaluated on."""
        self.examples = len(workload.train_data)
        """Rows in the training data."""

    def __call__(self, rows: np.ndarray) -> Evaluation:
        w, n = self.workload, self.workload.names
        x, y = w.train_data.batch(rows)
        values, grads = w.executor.inference_and_backprop(
            {n["input"]: x, n["labels"]: y}, loss=n["loss"], outputs=[n["logits"]])
        count = len(rows)
        return Evaluation(float(values[n["loss"]]) * count,
                          {k: np.asarray(g) * count for k, g in grads.items()},
                          int(np.count_nonzero(values[n["logits"]].argmax(1) == y)))
