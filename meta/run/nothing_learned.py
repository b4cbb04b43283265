"""The run's check that training changed anything (a warning at the end, not a failure)."""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.lv2 import Event, Trainer


class NothingLearned(Event):
    """Notes whether training changed anything: the parameters against a copy taken at the
    start, and the step losses against the first. ``verdict()`` is one warning line per kind
    of nothing (a strategy whose step updates nothing, a learning rate of 0), printed at the
    end of the run; a model with no trainable parameter is refused before training."""

    priority = -1_000

    def __init__(self) -> None:
        self.start: dict[str, np.ndarray] = {}
        self.first: float | None = None
        self.loss_changed = False
        self.steps = 0
        self.names: list[str] = []

    def on_train_begin(self, trainer: Trainer) -> None:
        params = trainer.executor.graph.parameters
        self.start = {k: np.array(v, copy=True) for k, v in params.items()}

    def on_step_end(self, trainer: Trainer, observation: dict[str, Any]) -> None:
        loss = float(observation["loss"])
        self.steps += 1
        if self.first is None:
            self.first = loss
        elif loss != self.first:
            self.loss_changed = True

    def on_train_end(self, trainer: Trainer) -> None:
        params = trainer.executor.graph.parameters
        self.names = [k for k, v in self.start.items() if k in params and
                      np.array_equal(np.asarray(params[k]), v)]

    def verdict(self) -> list[str]:
        """Lines saying why the run learned nothing (no parameter moved, a constant loss); empty
        when it learned."""
        lines = []
        if self.start and self.steps and len(self.names) == len(self.start):
            lines.append(f"training did nothing: none of the {len(self.start)} parameter "
                         f"tensors moved in {self.steps} step(s) (does the strategy's step "
                         f"update them? is the learning rate 0?)")
        if self.steps > 1 and not self.loss_changed:
            lines.append(f"the training loss never changed in {self.steps} steps "
                         f"({self.first:.6g} at every step)")
        return lines
