"""Trainer events: small classes called at a few points of training (Chainer's extensions).

An event overrides the hooks it needs; events run in descending ``priority`` (writers of
metrics before their readers). Metrics reach events only through the dicts passed to hooks.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from meta.common.component import Option, Registry
from meta.common.files import atomic_write

if TYPE_CHECKING:
    from meta.lv2.trainer import Trainer

Metrics = dict[str, Any]

# Named priorities (Chainer's PRIORITY_WRITER/EDITOR/READER): events run in descending order.
PRIORITY_EDITOR = 100  # changes what the epoch is (its batches) before anything reads it
PRIORITY_WRITER = 0  # writes or prints the epoch's metrics (the default)
PRIORITY_READER = -10  # decides from the epoch's complete metrics (early stopping)
PRIORITY_SAVER = -100  # saves the state once everything else has run (checkpoints)


class Event:
    """A hook object; ``finalize`` runs after training whatever happened (close files)."""

    priority: int = PRIORITY_WRITER

    def on_train_begin(self, trainer: Trainer) -> None:
        """Called once before the first step."""

    def on_epoch_begin(self, trainer: Trainer, epoch: int) -> None:
        """Called at the start of each epoch (``epoch`` counts from 0)."""

    def on_step_end(self, trainer: Trainer, observation: Metrics) -> None:
        """Called after each step with its observation (``step``, ``loss`` and what the step
        measured)."""

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        """Called after each epoch with its metrics (training and test loss and accuracy, ...);
        events may add their own."""

    def on_eval_batch(self, trainer: Trainer) -> None:
        """Called after each evaluation batch (an end-of-epoch evaluation can take seconds: a
        stop asked for meanwhile, such as SIGTERM's, acts here rather than after it)."""

    def on_train_end(self, trainer: Trainer) -> None:
        """Called once after the last epoch when training ended normally."""

    def on_error(self, trainer: Trainer, error: BaseException) -> None:
        """Called when training raised ``error`` (before it propagates)."""

    def finalize(self, trainer: Trainer) -> None:
        """Called after training whatever happened: close files, bars, plots."""


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

    def finalize(self, trainer: Trainer) -> None:
        self.close()

    def close(self) -> None:
        """Close the epoch's bar, if one is open."""
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


class EarlyStopping(Event):
    """Stops when ``metric`` has not improved by ``min_delta`` for ``patience`` epochs."""

    priority = PRIORITY_READER  # after the metrics of the epoch are complete

    def __init__(self, metric: str = "test_loss", patience: int = 3, mode: str = "min",
                 min_delta: float = 0.0) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping: mode must be 'min' or 'max', got {mode!r}")
        self.metric, self.patience, self.mode, self.min_delta = metric, patience, mode, min_delta
        self.best: float | None = None
        self.waited = 0

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        if self.metric not in metrics:
            raise KeyError(f"EarlyStopping: metric {self.metric!r} is not reported "
                           f"(reported: {', '.join(sorted(metrics))})")
        value = float(metrics[self.metric])
        sign = 1 if self.mode == "min" else -1
        if self.best is None or sign * (self.best - value) > self.min_delta:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            trainer.request_stop(f"early stopping: {self.metric} has not improved for "
                                 f"{self.patience} epoch(s) (best {self.best:.4g})")


class TimeBudget(Event):
    """Stops after ``seconds`` of training, checked every ``check_every`` steps.

    Replicas must stop at the same step, so the decision goes through ``trainer.sum_across``:
    one rank over budget stops them all (on one process that sum costs nothing).
    """

    def __init__(self, seconds: float, check_every: int = 1) -> None:
        self.seconds = seconds
        self.check_every = check_every
        self.start = 0.0

    def on_train_begin(self, trainer: Trainer) -> None:
        self.start = time.perf_counter()

    def on_step_end(self, trainer: Trainer, observation: Metrics) -> None:
        if observation["step"] % self.check_every:
            return
        over = float(time.perf_counter() - self.start > self.seconds)
        if trainer.sum_across(np.array([over]))[0] > 0:
            trainer.request_stop(f"time budget of {self.seconds:g} s used up at step "
                                 f"{observation['step']}")


class _FileLog(Event):
    """One record per epoch in a file, rewritten whole (atomically) after every epoch from the
    trainer's history: a crash or a full disk leaves the previous version, never half a line,
    and a resumed run's file holds exactly the epochs of its checkpoint and after."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_train_begin(self, trainer: Trainer) -> None:
        if not trainer.history:  # a fresh run starts a fresh file
            with atomic_write(self.path, newline=""):
                pass

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        with atomic_write(self.path, newline="") as f:
            self.write(f, [{k: float(v) for k, v in m.items()} for m in trainer.history])

    def write(self, f: Any, records: list[dict[str, float]]) -> None:
        """Write the epoch records so far to the open file ``f`` (the whole file is rewritten each
        epoch)."""
        raise NotImplementedError


class CSVLog(_FileLog):
    """Per-epoch metrics as CSV, with the columns of the first epoch."""

    def write(self, f: Any, records: list[dict[str, float]]) -> None:
        writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else [],
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


class JSONLinesLog(_FileLog):
    """Per-epoch metrics as JSON lines (one object per epoch)."""

    def write(self, f: Any, records: list[dict[str, float]]) -> None:
        f.writelines(json.dumps(r) + "\n" for r in records)


class PlotMetrics(Event):
    """Draws loss and accuracy curves per epoch as a PNG: after an epoch when ``every_s``
    seconds have passed since the last drawing (the first epoch's always), and at the end
    with every epoch, however training ended. Drawing costs ~0.15 s of CPU (0.4 s the first
    time), which on short epochs was a third of a run: the file is a live view, refreshed
    at most every ``every_s``, and complete at the end."""

    def __init__(self, path: str | Path, title: str = "", every_s: float = 10.0) -> None:
        self.path = Path(path)
        self.title = title
        self.every_s = every_s
        self.drawn_at = -float("inf")
        """time.monotonic() of the last drawing"""
        self.drawn_epochs = 0
        """how many epochs the file shows"""

    def on_epoch_end(self, trainer: Trainer, metrics: Metrics) -> None:
        if time.monotonic() - self.drawn_at >= self.every_s:
            self.draw(trainer.history)

    def finalize(self, trainer: Trainer) -> None:
        if len(trainer.history) > self.drawn_epochs:
            self.draw(trainer.history)

    def draw(self, history: list[Metrics]) -> None:
        """The curves of ``history`` into ``path``, atomically (matplotlib's Agg canvas: no
        pyplot, no display, no global figure state)."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        epochs = [m["epoch"] for m in history]
        fig = Figure(figsize=(9, 3.5))
        FigureCanvasAgg(fig)
        loss_ax, acc_ax = fig.subplots(1, 2)
        for split, style in (("train", "-o"), ("test", "-s")):
            if f"{split}_loss" in history[-1]:
                loss_ax.plot(epochs, [m[f"{split}_loss"] for m in history], style, label=split)
                acc_ax.plot(epochs, [100 * m[f"{split}_accuracy"] for m in history], style,
                            label=split)
        loss_ax.set(xlabel="epoch", ylabel="loss", title="loss")
        acc_ax.set(xlabel="epoch", ylabel="accuracy (%)", title="accuracy")
        for ax in (loss_ax, acc_ax):
            ax.grid(alpha=0.3)
            ax.legend()
        if self.title:
            fig.suptitle(self.title)
        fig.tight_layout()
        with atomic_write(self.path, "wb") as f:
            fig.savefig(f, dpi=100, format=self.path.suffix[1:] or "png")
        self.drawn_at, self.drawn_epochs = time.monotonic(), len(history)


# Events as recipes name them (``"events": [{"name": "early_stopping", "patience": 2}]``), or a
# user's Event subclass given as itself; a class states its options in ``options``.
EVENTS = Registry("event")
EVENTS.add("early_stopping", EarlyStopping, {
    "metric": Option("test_loss", "the epoch metric watched"),
    "patience": Option(3, "epochs without improvement before stopping", low=1),
    "mode": Option("min", "min: lower is better; max: higher", choices=("min", "max")),
    "min_delta": Option(0.0, "the least change that counts as better", low=0.0)})
EVENTS.add("time_budget", TimeBudget, {
    "seconds": Option(doc="stop training after this many seconds", type=float, above=0.0),
    "check_every": Option(10, "steps between checks (an allreduce each under MPI)", low=1)})


def register_event(name: str | None = None, **options: Option):
    """Make an Event subclass selectable by name in a recipe's ``events`` list."""
    return EVENTS.register(name, **options)
