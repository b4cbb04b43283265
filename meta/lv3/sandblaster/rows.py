"""Sandblaster's rows: what a worker evaluates (a loss sum, gradient sums and a count correct
over rows of the batch), from a function or from a Level 2 trainer's data and executor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from meta.lv2.optimizers import Params


class Evaluation(NamedTuple):
    """A portion's sums: loss summed over its rows, gradients of that sum, count correct."""

    loss_sum: float
    grads: Params
    correct: int


class RowsEvaluator(Protocol):
    """Evaluates rows (indices below ``examples``) of a dataset at the current parameters."""

    examples: int

    def __call__(self, rows: np.ndarray) -> Evaluation: ...


class RowsFunction:
    """A ``RowsEvaluator`` from a function of the rows."""

    def __init__(self, function: Callable[[np.ndarray], Evaluation], examples: int) -> None:
        self.function, self.examples = function, examples

    def __call__(self, rows: np.ndarray) -> Evaluation:
        return self.function(rows)


class TrainerRows:
    """Rows of a Level 2 trainer's training data through its executor (mean loss graph)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.examples = len(trainer.train_data)

    def __call__(self, rows: np.ndarray) -> Evaluation:
        t, n = self.trainer, self.trainer.names
        x, y = t.train_data.batch(rows)
        values, grads = t.executor.inference_and_backprop(
            {n["input"]: x, n["labels"]: y}, loss=n["loss"], outputs=[n["logits"]])
        count = len(rows)
        return Evaluation(float(values[n["loss"]]) * count,
                          {k: np.asarray(g) * count for k, g in grads.items()},
                          int(np.count_nonzero(values[n["logits"]].argmax(1) == y)))
