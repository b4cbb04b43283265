"""The trainer: the epoch loop over a sampler, optimizer steps, evaluation and events."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np

from meta.common.user_code import user_code
from meta.lv1.executor import Executor
from meta.lv2.datasets import IGNORE_INDEX, Dataset
from meta.lv2.events import Event, Metrics
from meta.lv2.sampler import ShuffleSampler
from meta.lv2.updater import Updater
from meta.lv2.weight_average import WeightAverage


def _event_name(event: Any) -> str:
    """How a message names an event: its recipe name where it has one, else its class."""
    return str(getattr(event, "name", None) or type(event).__name__)


def hits(logits: np.ndarray, labels: np.ndarray) -> tuple[int, int]:
    """(correct predictions, targets counted): one per example for labels (N,) and logits
    (N, C); one per position for labels (N, T, ...) and logits (N, C, T, ...) (the class axis
    second, as ONNX's SoftmaxCrossEntropyLoss reads it), skipping ``IGNORE_INDEX`` padding.
    The loss of a batch is the mean over the same targets, so ``loss * count`` sums alike."""
    right = logits.argmax(1) == labels
    if labels.ndim == 1:
        return int(np.count_nonzero(right)), len(labels)
    kept = labels != IGNORE_INDEX
    return int(np.count_nonzero(right & kept)), int(np.count_nonzero(kept))


class Stepper(Protocol):
    needs_closure: bool

    def step(self, grads: dict[str, np.ndarray]) -> None: ...


class Trainer:
    """Trains a classifier graph with inputs ``input``/``labels`` and outputs ``logits``/``loss``.

    ``optimizer`` is stepped by an ``Updater`` (``meta.lv2.updater``), or is one: the updater
    does every update, adds up metric sums over replicas (``sum_across``: the identity on one
    process) and makes the replicas' state agree before evaluating; a Level 3 strategy hands
    the trainer its own through ``use``. ``eval_shard = (rank, size)`` splits evaluation, so
    every replica reports the same metrics without Level 2 knowing about MPI.

    Training steps run the executor in training mode, evaluation in inference mode (PyTorch's
    ``model.train()`` / ``model.eval()``).
    """

    def __init__(
        self,
        executor: Executor,
        optimizer: Stepper | Updater,
        train_data: Dataset,
        sampler: ShuffleSampler,
        test_data: Dataset | None = None,
        events: Iterable[Event] = (),
        eval_batch_size: int = 1000,
        sum_across: Callable[[np.ndarray], np.ndarray] | None = None,
        eval_shard: tuple[int, int] = (0, 1),
        names: dict[str, str] | None = None,
        transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
        output_dir: Any = None,
        ema_decay: float = 0.0,
        ema_every: int = 1,
    ) -> None:
        self.executor = executor
        if isinstance(optimizer, Updater) and sum_across is not None:
            raise ValueError("Trainer: sum_across belongs to the updater given as optimizer")
        self.updater = optimizer if isinstance(optimizer, Updater) else Updater(optimizer,
                                                                                 sum_across)
        self.train_data = train_data
        self.sampler = sampler
        self.test_data = test_data
        self.events = sorted(events, key=lambda e: -e.priority)
        self.eval_batch_size = eval_batch_size
        self.eval_shard = eval_shard
        # Whether this process is the one that prints (an event's text output): the runner
        # says so under MPI, where strategies such as pipelines make every rank the first of
        # its replica group, so eval_shard cannot tell
        self.prints = eval_shard[0] == 0
        self.transform = transform  # training augmentation, drawing from the sampler's RNG
        self.output_dir = output_dir  # where the run writes its files (events may too)
        self.names = {"input": "input", "labels": "labels", "logits": "logits", "loss": "loss",
                      **(names or {})}
        self.history: list[Metrics] = []
        self.epochs = 0
        self.step = 0
        # Where the current epoch stands, so a checkpoint taken mid-epoch resumes exactly.
        self.batch_in_epoch = 0
        # loss * count, correct, count; the count is of targets (tokens, for per-position
        # labels), so an epoch's loss and accuracy are per token, and samples_per_s tokens/s
        self.epoch_sums = np.zeros(3)
        self.epoch_elapsed = 0.0
        self.stop_reason: str | None = None  # set by an event (early stopping, time budget)
        self.finalize_failures: list[str] = []  # events whose finalize raised (one line each)
        # ema_decay: the weights' moving average is evaluated and, after training, kept;
        # updated every ema_every steps (the optimizer's: micro-batches under accumulate)
        self.average = WeightAverage(ema_decay) if ema_decay else None
        self.ema_every = ema_every
        self.eval_time_s = 0.0  # spent in the end-of-epoch evaluations, apart from training

    @property
    def optimizer(self) -> Any:
        """What steps the parameters (a strategy, under Level 3): checkpoints save its state."""
        return self.updater.optimizer

    def sum_across(self, values: np.ndarray) -> np.ndarray:
        """``values`` (metric sums) added up over the replicas, by the updater."""
        return self.updater.sum_across(values)

    def use(self, updater: Updater) -> None:
        """Update through ``updater`` from now on (a strategy's: ``Strategy.updater()``); run
        the executor it brings, if any, and have the executor record its phases on its
        timeline."""
        self.updater = updater
        if updater.executor is not None:
            self.executor = updater.executor
        if updater.timeline is not None:
            self.executor.timeline = updater.timeline

    def add_events(self, events: Iterable[Event]) -> None:
        """Attach ``events`` from now on (in priority order with the others). A new list: an
        event may be added while the trainer emits to the old one."""
        self.events = sorted([*self.events, *events], key=lambda e: -e.priority)

    def request_stop(self, reason: str) -> None:
        """Ask the loop to stop after the current step; ``reason`` is kept for the report."""
        self.stop_reason = self.stop_reason or reason

    @property
    def steps_per_epoch(self) -> int:
        return len(self.sampler)

    def _where(self, hook: str) -> str:
        return f"in {hook} at epoch {len(self.history) + 1}, step {self.step}"

    def _emit(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of every event in priority order. Events are components a recipe may
        bring: an exception one raises is marked with the event, the hook and the step
        (``meta.run.errors.user_code``), which ``meta run`` reports in one line."""
        for event in self.events:
            with user_code(f"event {_event_name(event)!r}", "events", self._where(hook)):
                getattr(event, hook)(self, *args)

    def _emit_defined(self, hook: str) -> None:
        """``_emit`` to the events that have ``hook`` (one added after events were written
        without it, such as ``on_eval_batch``)."""
        for event in self.events:
            method = getattr(event, hook, None)
            if method is not None:
                with user_code(f"event {_event_name(event)!r}", "events", self._where(hook)):
                    method(self)

    def _emit_isolated(self, hook: str, *args: Any) -> list[str]:
        """Call ``hook`` of every event even when some raise (after an error, and when
        finalizing, one failing event must not keep the others from cleaning up); returns
        one line per failure, which the caller reports without hiding the first error."""
        failures = []
        for event in self.events:
            try:
                getattr(event, hook, lambda *_: None)(self, *args)
            except Exception as err:  # noqa: BLE001 - reported, never swallowed silently
                failures.append(f"event {_event_name(event)!r} raised {type(err).__name__} "
                                f"{self._where(hook)}: {err}")
        return failures

    def fit(self, epochs: int) -> list[Metrics]:
        """Train for ``epochs`` epochs; returns the per-epoch metrics.

        On an error every event's ``on_error`` runs (each isolated: one that raises is noted
        on the error, not in its place); ``finalize`` runs in ``finally`` whatever happened
        (Chainer's ``Extension.finalize``), so files and bars are closed after an error too."""
        self.epochs = epochs
        try:
            self._emit("on_train_begin")
            for epoch in range(len(self.history), epochs):
                if self.stop_reason:
                    break
                self._emit("on_epoch_begin", epoch)
                metrics = self.train_epoch(epoch)
                if self.test_data is not None:
                    started = time.perf_counter()
                    metrics.update(self.evaluate(self.test_data, prefix="test_"))
                    self.eval_time_s += time.perf_counter() - started
                self.history.append(metrics)
                # The epoch's position is cleared once its metrics are in the history: a
                # checkpoint taken during its evaluation resumes after its last step.
                self.batch_in_epoch, self.epoch_sums, self.epoch_elapsed = 0, np.zeros(3), 0.0
                self._emit("on_epoch_end", metrics)
            if self.average is not None:  # what is measured, exported and saved from now on
                self.average.install(self.executor.graph.parameters)
                self.executor.graph.touch()
            self._emit("on_train_end")
        except BaseException as err:
            for failure in self._emit_isolated("on_error", err):
                err.add_note(f"also: {failure}")
            raise
        finally:
            self.finalize_failures = self._emit_isolated("finalize")
        return self.history

    def position(self) -> dict[str, Any]:
        """Everything a checkpoint needs to continue this loop exactly where it is."""
        return {"epoch": len(self.history), "step": self.step,
                "batch_in_epoch": self.batch_in_epoch, "epoch_sums": self.epoch_sums.tolist(),
                "epoch_elapsed": self.epoch_elapsed, "history": self.history}

    def restore_position(self, position: dict[str, Any]) -> None:
        self.history = [dict(m) for m in position["history"]]
        self.step = int(position["step"])
        self.batch_in_epoch = int(position["batch_in_epoch"])
        self.epoch_sums = np.array(position["epoch_sums"], dtype=np.float64)
        self.epoch_elapsed = float(position["epoch_elapsed"])

    def train_epoch(self, epoch: int) -> Metrics:
        n = self.names
        self.sampler.set_epoch(epoch)
        skip = self.batch_in_epoch  # > 0 only when resuming mid-epoch
        start = time.perf_counter() - self.epoch_elapsed
        self.executor.train(True)
        for index, indices in enumerate(self.sampler):
            if index < skip:
                continue
            if self.updater.evaluates_rows:
                # The updater has these rows of train_data evaluated where the data is
                # (Level 3 Sandblaster's workers); it returns the loss and the count correct
                # at the parameters before its update.
                loss, correct = self.updater.step_rows(indices)
                count = len(indices)
            else:
                x, y = self.train_data.batch(indices)
                if self.transform is not None:
                    x = self.transform(x, self.sampler.batch_rng(index))
                values = self._optimizer_step({n["input"]: x, n["labels"]: y})
                loss = float(values[n["loss"]])
                correct, count = hits(values[n["logits"]], y)
            self.executor.graph.touch()  # the step wrote the weights (a strategy: anyhow)
            if self.average is not None and (self.step + 1) % self.ema_every == 0:
                self.average.update(self.executor.graph.parameters)
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at epoch {epoch + 1}, "
                                         f"step {self.step + 1}")
            self.epoch_sums += (loss * count, correct, count)
            self.step += 1
            self.batch_in_epoch += 1
            self.epoch_elapsed = time.perf_counter() - start
            self._emit("on_step_end", {"epoch": epoch, "step": self.step, "loss": loss})
            if self.stop_reason:
                break
        elapsed = time.perf_counter() - start
        loss_sum, correct, count = self.sum_across(self.epoch_sums.copy())
        return {"epoch": epoch + 1, "train_loss": loss_sum / count,
                "train_accuracy": correct / count, "epoch_time_s": elapsed,
                "samples_per_s": count / elapsed}

    def _optimizer_step(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One update on this batch (the updater's); returns the values (loss, logits) before
        the update."""
        n = self.names
        return self.updater.step(self.executor, feeds, n["loss"], [n["logits"]])

    def evaluate(self, data: Dataset, prefix: str = "") -> Metrics:
        """Mean loss and accuracy over ``data`` (this replica's shard, summed across replicas):
        per example, or per token for per-position labels (padding skipped)."""
        def sums(logits: np.ndarray, labels: np.ndarray, loss: float) -> list[float]:
            correct, count = hits(logits, labels)
            return [loss * count, float(correct), float(count)]

        loss_sum, correct, count = self.evaluate_with(sums, data, with_loss=True)
        return {f"{prefix}loss": loss_sum / count, f"{prefix}accuracy": correct / count}

    def evaluate_with(self, sums: Callable[..., Any], data: Dataset | None = None,
                      with_loss: bool = False) -> np.ndarray:
        """``sums(logits, labels[, loss])`` added up over every eval batch of ``data`` (the
        test data by default) on this replica's shard, then across replicas: one pass in
        evaluation mode for metrics such as top-k accuracy or a class's recall."""
        with self._averaged():
            return self._evaluate_with(sums, data, with_loss)

    @contextmanager
    def _averaged(self) -> Iterator[None]:
        """The weights' moving average (``ema_decay``) in place while evaluating."""
        if self.average is None:
            yield
            return
        graph = self.executor.graph
        try:
            with self.average.swapped(graph.parameters):
                graph.touch()  # the executor sees the values written (its version stamp)
                yield
        finally:
            graph.touch()

    def _evaluate_with(self, sums: Callable[..., Any], data: Dataset | None,
                       with_loss: bool) -> np.ndarray:
        n = self.names
        data = self.test_data if data is None else data
        self.updater.sync_state(self.executor)
        self.executor.train(False)
        rank, size = self.eval_shard
        shard = np.array_split(np.arange(len(data)), size)[rank]
        wanted = [n["logits"], n["loss"]] if with_loss else [n["logits"]]
        total: np.ndarray | None = None
        for start in range(0, len(shard), self.eval_batch_size):
            x, y = data.batch(shard[start : start + self.eval_batch_size])
            out = self.executor.inference({n["input"]: x, n["labels"]: y}, wanted)
            extra = (float(out[n["loss"]]),) if with_loss else ()
            part = np.asarray(sums(out[n["logits"]], y, *extra), dtype=np.float64)
            total = part if total is None else total + part
            self._emit_defined("on_eval_batch")
        if total is None:  # an empty shard still joins the sum across replicas: zeros
            x, y = data.batch(np.arange(1))
            logits = self.executor.inference({n["input"]: x, n["labels"]: y}, wanted)[
                n["logits"]]
            total = np.zeros(len(sums(logits[:0], y[:0], *((0.0,) if with_loss else ()))))
        summed = self.sum_across(total)
        if self.eval_shard != (rank, size):  # a replica died in the sum: again, re-sharded
            return self._evaluate_with(sums, data, with_loss)
        return summed
