"""What the rank that writes a run's outputs runs as events: the progress bar, the epoch lines,
the logs, the curves and the checkpoints (rank 0, or the rank that takes over from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TextIO

from meta.common.component import ComponentError
from meta.lv2 import (
    CheckpointEvent,
    CSVLog,
    EpochLog,
    Event,
    JSONLinesLog,
    PlotMetrics,
    ProgressBar,
)
from meta.lv2.step_log import StepLog
from meta.lv2.tensorboard_log import MissingTensorBoard, TensorBoardLog
from meta.run.recipe import Recipe
from meta.run.resume import CHECKPOINT, vocabulary_info


def writer_events(recipe: Recipe, output_dir: Path | None, stream: TextIO, progress: bool,
                  checkpoint_every: int, train_data: Any) -> list[Event]:
    """The writer's events for ``recipe``'s run: files under ``output_dir`` (none without
    one); the checkpoint keeps the definitions and the vocabulary ``--resume`` checks; the
    recipe's ``log_every`` adds step lines, its ``tensorboard`` an event file."""
    d = recipe.definitions
    events: list[Event] = [ProgressBar(disable=None if progress else True), EpochLog(stream)]
    if d.log_every:
        events.append(StepLog(d.log_every, stream))
    if d.tensorboard and output_dir is not None:
        try:
            events.append(TensorBoardLog(output_dir / "tensorboard", d.log_every or 1))
        except MissingTensorBoard as err:
            raise ComponentError(str(err)) from None
    if output_dir is not None:
        out = output_dir
        events += [CSVLog(out / "metrics.csv"), JSONLinesLog(out / "metrics.jsonl"),
                   PlotMetrics(out / "curves.png", title=recipe.name),
                   CheckpointEvent(out / CHECKPOINT, checkpoint_every,
                                   info={"recipe": recipe.name,
                                         "definitions": recipe.definitions.as_dict(),
                                         **vocabulary_info(train_data)})]
    return events
