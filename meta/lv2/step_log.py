"""A step line every ``log_every`` steps (``log_every`` in a recipe): an epoch can take minutes,
and its line is the first sign of life otherwise.

Each line is the mean training loss over the steps since the previous line and their rate::

    step    200  epoch 1  loss 2.3141  41.7 steps/s
"""

from __future__ import annotations

import sys
import time
from typing import Any

from meta.lv2.events import PRIORITY_READER, Event


class StepLog(Event):
    """Prints the mean loss of the last ``every`` steps and their steps/s."""

    priority = PRIORITY_READER

    def __init__(self, every: int, stream: Any = None) -> None:
        if every < 1:
            raise ValueError(f"log_every must be at least 1, got {every}")
        self.every, self.stream = every, stream
        self.loss_sum, self.count, self.since = 0.0, 0, time.perf_counter()

    def on_step_end(self, trainer: Any, observation: dict[str, Any]) -> None:
        self.loss_sum += observation["loss"]
        self.count += 1
        if observation["step"] % self.every:
            return
        now = time.perf_counter()
        rate = self.count / max(now - self.since, 1e-9)
        print(f"step {observation['step']:>6d}  epoch {observation['epoch'] + 1}  "
              f"loss {self.loss_sum / self.count:.4f}  {rate:.1f} steps/s",
              file=self.stream or sys.stdout, flush=True)
        self.loss_sum, self.count, self.since = 0.0, 0, now
