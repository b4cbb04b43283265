"""The trainer: the epoch loop over a sampler, optimizer steps, evaluation and events."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from meta.lv2.datasets import Dataset
from meta.lv2.events import Event, Metrics
from meta.lv2.sampler import ShuffleSampler


class Executor(Protocol):
    def train(self, mode: bool = True) -> Any: ...
    def inference(self, feeds: dict, outputs: Iterable[str] | None = None) -> dict: ...
    def inference_and_backprop(self, feeds: dict, loss: str = "loss",
                               outputs: Iterable[str] | None = None) -> tuple[dict, dict]: ...


class Stepper(Protocol):
    def step(self, grads: dict[str, np.ndarray]) -> None: ...


def _identity(values: np.ndarray) -> np.ndarray:
    return values


class Trainer:
    """Trains a classifier graph with inputs ``input``/``labels`` and outputs ``logits``/``loss``.

    ``sum_across`` adds up metric sums over replicas (identity on one process; Level 3 passes an
    allreduce), and ``eval_shard = (rank, size)`` splits evaluation, so every replica reports
    the same metrics without Level 2 knowing about MPI.

    Training steps run the executor in training mode, evaluation in inference mode (PyTorch's
    ``model.train()`` / ``model.eval()``). Before evaluating, an optimizer that can
    (``sync_state``: Level 3 strategies) makes the replicas' state (running statistics) agree.
    """

    def __init__(
        self,
        executor: Executor,
        optimizer: Stepper,
        train_data: Dataset,
        sampler: ShuffleSampler,
        test_data: Dataset | None = None,
        events: Iterable[Event] = (),
        eval_batch_size: int = 1000,
        sum_across: Callable[[np.ndarray], np.ndarray] = _identity,
        eval_shard: tuple[int, int] = (0, 1),
        names: dict[str, str] | None = None,
        transform: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
        output_dir: Any = None,
    ) -> None:
        self.executor = executor
        self.optimizer = optimizer
        self.train_data = train_data
        self.sampler = sampler
        self.test_data = test_data
        self.events = sorted(events, key=lambda e: -e.priority)
        self.eval_batch_size = eval_batch_size
        self.sum_across = sum_across
        self.eval_shard = eval_shard
        self.transform = transform  # training augmentation, drawing from the sampler's RNG
        self.output_dir = output_dir  # where the run writes its files (events may too)
        self.names = {"input": "input", "labels": "labels", "logits": "logits", "loss": "loss",
                      **(names or {})}
        self.history: list[Metrics] = []
        self.epochs = 0
        self.step = 0
        # Where the current epoch stands, so a checkpoint taken mid-epoch resumes exactly.
        self.batch_in_epoch = 0
        self.epoch_sums = np.zeros(3)  # loss * count, correct, count
        self.epoch_elapsed = 0.0
        self.stop_reason: str | None = None  # set by an event (early stopping, time budget)

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

    def _emit(self, hook: str, *args: Any) -> None:
        for event in self.events:
            getattr(event, hook)(self, *args)

    def fit(self, epochs: int) -> list[Metrics]:
        """Train for ``epochs`` epochs; returns the per-epoch metrics."""
        self.epochs = epochs
        self._emit("on_train_begin")
        try:
            for epoch in range(len(self.history), epochs):
                if self.stop_reason:
                    break
                self._emit("on_epoch_begin", epoch)
                metrics = self.train_epoch(epoch)
                if self.test_data is not None:
                    metrics.update(self.evaluate(self.test_data, prefix="test_"))
                self.history.append(metrics)
                self._emit("on_epoch_end", metrics)
        except BaseException as err:
            self._emit("on_error", err)
            raise
        self._emit("on_train_end")
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
            if getattr(self.optimizer, "evaluates_rows", False):
                # The optimizer has these rows of train_data evaluated where the data is
                # (Level 3 Sandblaster's workers); it returns the loss and the count correct
                # at the parameters before its update.
                loss, correct = self.optimizer.step_rows(indices)
            else:
                x, y = self.train_data.batch(indices)
                if self.transform is not None:
                    x = self.transform(x, self.sampler.batch_rng(index))
                values = self._optimizer_step({n["input"]: x, n["labels"]: y})
                loss = float(values[n["loss"]])
                correct = np.count_nonzero(values[n["logits"]].argmax(1) == y)
            self.executor.graph.touch()  # the step wrote the weights (a strategy: anyhow)
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss became {loss} at epoch {epoch + 1}, "
                                         f"step {self.step + 1}")
            self.epoch_sums += (loss * len(indices), correct, len(indices))
            self.step += 1
            self.batch_in_epoch += 1
            self.epoch_elapsed = time.perf_counter() - start
            self._emit("on_step_end", {"epoch": epoch, "step": self.step, "loss": loss})
            if self.stop_reason:
                break
        elapsed = time.perf_counter() - start
        loss_sum, correct, count = self.sum_across(self.epoch_sums.copy())
        self.batch_in_epoch, self.epoch_sums, self.epoch_elapsed = 0, np.zeros(3), 0.0
        return {"epoch": epoch + 1, "train_loss": loss_sum / count,
                "train_accuracy": correct / count, "epoch_time_s": elapsed,
                "samples_per_s": count / elapsed}

    def _optimizer_step(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One update on this batch; returns the values (loss, logits) before the update.

        Line-search optimizers (``needs_closure``: L-BFGS, CG) evaluate the batch as often as
        they need through a closure; others take the gradients of one evaluation.
        """
        n = self.names
        first: list[dict[str, np.ndarray]] = []

        def closure() -> tuple[float, dict[str, np.ndarray]]:
            values, grads = self.executor.inference_and_backprop(
                feeds, loss=n["loss"], outputs=[n["logits"]])
            if not first:
                first.append(values)
            return float(values[n["loss"]]), grads

        if getattr(self.optimizer, "needs_closure", False):
            self.optimizer.step(closure)
        elif hasattr(self.optimizer, "step_with"):  # a strategy: it may overlap the backward
            return self.optimizer.step_with(self.executor, feeds, loss=n["loss"],
                                            outputs=[n["logits"]])
        else:
            self.optimizer.step(closure()[1])
        return first[0]

    def evaluate(self, data: Dataset, prefix: str = "") -> Metrics:
        """Mean loss and accuracy over ``data`` (this replica's shard, summed across replicas)."""
        def sums(logits: np.ndarray, labels: np.ndarray, loss: float) -> list[float]:
            return [loss * len(labels), float(np.count_nonzero(logits.argmax(1) == labels)),
                    float(len(labels))]

        loss_sum, correct, count = self.evaluate_with(sums, data, with_loss=True)
        return {f"{prefix}loss": loss_sum / count, f"{prefix}accuracy": correct / count}

    def evaluate_with(self, sums: Callable[..., Any], data: Dataset | None = None,
                      with_loss: bool = False) -> np.ndarray:
        """``sums(logits, labels[, loss])`` added up over every eval batch of ``data`` (the
        test data by default) on this replica's shard, then across replicas: one pass in
        evaluation mode for metrics such as top-k accuracy or a class's recall."""
        n = self.names
        data = self.test_data if data is None else data
        sync_state = getattr(self.optimizer, "sync_state", None)
        if sync_state is not None:
            sync_state(self.executor.graph.state)
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
        if total is None:  # an empty shard still joins the sum across replicas: zeros
            x, y = data.batch(np.arange(1))
            logits = self.executor.inference({n["input"]: x, n["labels"]: y}, wanted)[
                n["logits"]]
            total = np.zeros(len(sums(logits[:0], y[:0], *((0.0,) if with_loss else ()))))
        summed = self.sum_across(total)
        if self.eval_shard != (rank, size):  # a replica died in the sum: again, re-sharded
            return self.evaluate_with(sums, data, with_loss)
        return summed
