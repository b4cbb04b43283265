"""TensorBoard event files (``tensorboard: True`` in a recipe): the step loss every
``log_every`` steps and every epoch's metrics, written by tensorboardX's ``SummaryWriter`` (a
well-kept writer of the TensorBoard format: the optional ``tensorboard`` extra). One event file
per run in the output folder's ``tensorboard/``; ``tensorboard --logdir runs`` shows every run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from meta.lv2.events import PRIORITY_READER, Event

EXTRA = "pip install 'meta[tensorboard]' (tensorboardX)"


class MissingTensorBoard(ImportError):
    """tensorboardX is not installed; the message names the extra that brings it."""


class TensorBoardLog(Event):
    """Scalars for TensorBoard: ``train/loss`` at every ``every``-th step, ``epoch/<metric>``
    at every epoch's end (x: the step)."""

    priority = PRIORITY_READER

    def __init__(self, folder: str | Path, every: int = 1) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as err:
            raise MissingTensorBoard(f"tensorboard: True needs tensorboardX: {EXTRA}") from err
        self.folder, self.every = Path(folder), max(1, every)
        self.writer = SummaryWriter(logdir=str(self.folder))

    def on_step_end(self, trainer: Any, observation: dict[str, Any]) -> None:
        if observation["step"] % self.every == 0:
            self.writer.add_scalar("train/loss", observation["loss"], observation["step"])

    def on_epoch_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value) and key != "epoch":
                self.writer.add_scalar(f"epoch/{key}", value, trainer.step)
        self.writer.flush()

    def finalize(self, trainer: Any) -> None:
        self.writer.close()
