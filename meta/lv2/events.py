"""Trainer events: small classes called at a few points of training (Chainer's extensions).

An event overrides the hooks it needs; events run in descending ``priority`` (writers of
metrics before their readers). Metrics reach events only through the dicts passed to hooks.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meta.lv2.trainer import Trainer

Metrics = dict[str, Any]


class Event:
    priority: int = 0

    def on_train_begin(self, trainer: Trainer) -> None: ...
    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None: ...
    def on_step_end(self, trainer: Trainer, observation: Metrics) -> None: ...
    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...
    def on_error(self, trainer: Trainer, error: BaseException) -> None: ...


class ProgressBar(Event):
    """A tqdm bar per epoch with the running loss (hidden when stderr is not a terminal)."""

    def __init__(self, disable: bool | None = None) -> None:
        self.disable = disable
        self.bar = None

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=trainer.steps_per_epoch, desc=f"epoch {epoch + 1}/{trainer.epochs}",
                        unit="step", leave=False, disable=self.disable, file=sys.stderr)

    def on_step_end(self, trainer: Trainer, observation: Metrics) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if observation["step"] % 20 == 0:
                self.bar.set_postfix(loss=f"{observation['loss']:.4f}", refresh=False)

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        self.close()

    def on_error(self, trainer: Trainer, error: BaseException) -> None:
        self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EpochLog(Event):
    """Prints one line of metrics per epoch, as a table with a header."""

    COLUMNS = (("epoch", "{:>5d}"), ("train_loss", "{:>10.4f}"), ("train_accuracy", "{:>9.2%}"),
               ("test_loss", "{:>9.4f}"), ("test_accuracy", "{:>8.2%}"),
               ("epoch_time_s", "{:>7.1f}s"), ("samples_per_s", "{:>10.0f}"))
    HEADER = "epoch  train loss  train acc  test loss  test acc     time   samples/s"

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream

    def on_train_begin(self, trainer: Trainer) -> None:
        print(self.HEADER, file=self.stream or sys.stdout, flush=True)

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        cells = []
        for key, fmt in self.COLUMNS:
            value = metrics.get(key)
            width = len(fmt.format(0 if "d" in fmt else 0.0))
            cells.append("-".rjust(width) if value is None else fmt.format(value))
        print("  ".join(cells), file=self.stream or sys.stdout, flush=True)
