"""A trainer event that records step times and loss curves, so that benchmarking needs no change
to the trainer itself."""

from __future__ import annotations

import time
from typing import Any

from meta.lv2.events import Event, Metrics

CURVE_KEYS = ("train_loss", "test_loss", "train_accuracy", "test_accuracy", "samples_per_s")


class StepTimer(Event):
    """Per-step wall time (ns) and loss, and per-epoch loss and accuracy, of one training run.

    A step's time runs from the end of the previous step (or the start of its epoch) to the end
    of this one: fetching the batch, forward, backward, the update, and the events of the
    previous step, as the training loop sees it. The highest priority makes this event read
    the clock before any other event of the step runs. Evaluation is not part of any step.
    """

    priority = 1_000_000

    def __init__(self) -> None:
        self.step_ns: list[int] = []
        self.step_loss: list[float] = []
        self.epochs: list[dict[str, Any]] = []
        self._last = self._start = 0

    def on_train_begin(self, trainer: Any) -> None:
        self._start = time.perf_counter_ns()

    def on_epoch_begin(self, trainer: Any, epoch: int) -> None:
        self._last = time.perf_counter_ns()

    def on_step_end(self, trainer: Any, observation: Metrics) -> None:
        now = time.perf_counter_ns()
        self.step_ns.append(now - self._last)
        self.step_loss.append(float(observation["loss"]))
        self._last = now

    def on_epoch_end(self, trainer: Any, metrics: Metrics) -> None:
        # elapsed_s: wall time since training began, evaluation included (time to accuracy)
        self.epochs.append({"epoch": int(metrics.get("epoch", len(self.epochs) + 1)),
                            "elapsed_s": (time.perf_counter_ns() - self._start) * 1e-9,
                            **{k: float(metrics[k]) for k in CURVE_KEYS if k in metrics}})

    def attach(self, trainer: Any) -> StepTimer:
        """Add this event to ``trainer``, keeping its events in priority order."""
        trainer.events = sorted([*trainer.events, self], key=lambda e: -e.priority)
        return self
