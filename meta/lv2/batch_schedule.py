"""Growing the batch instead of decaying the learning rate (Smith et al. 2018).

"Don't decay the learning rate, increase the batch size": SGD's noise scale is roughly
``lr * N / B``, so multiplying the batch ``B`` by a factor at the epochs where a step schedule
would divide the learning rate by it anneals the noise the same way, while each epoch takes that
factor fewer steps (and, distributed, fewer exchanges). The event sets the sampler's batch at
the start of every epoch from the epoch alone, so a resumed run gets the same batches.

Under MPI the sampler's batch is per rank (``DistributedSampler``): every rank runs the event
with the same options and grows its own batch by the same factor, so the global batch grows by
it too and the ranks keep taking the same number of steps per epoch.

>>> from meta.lv2.sampler import ShuffleSampler
>>> class Run:  # the part of the trainer the event uses
...     sampler = ShuffleSampler(1000, batch_size=10)
>>> growth, run = BatchGrowth(epochs=(2, 4), factor=5), Run()
>>> growth.on_train_begin(run)
>>> sizes = []
>>> for epoch in range(5):
...     growth.on_epoch_begin(run, epoch)
...     sizes.append((run.sampler.batch_size, len(run.sampler)))
>>> sizes
[(10, 100), (10, 100), (50, 20), (50, 20), (250, 4)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meta.common.component import ComponentError, Option
from meta.lv2.events import EVENTS, Event

if TYPE_CHECKING:
    from meta.lv2.trainer import Trainer


class BatchGrowth(Event):
    """Multiplies the batch by ``factor`` after each of ``epochs``, where a step learning-rate
    schedule (``lr_decay_epochs``) would multiply the learning rate by ``1 / factor``.

    Each epoch's metrics gain ``batch_size`` (per rank) and ``steps`` (taken so far). A
    ``factor`` of 1 keeps the batch: the same recipe then serves as its own baseline. Use it
    with a constant learning rate: step and cosine schedules count the steps of the first
    epoch's batch.
    """

    priority = 100  # before anything reads the epoch's number of steps (the progress bar)
    options = {
        "epochs": Option(doc="epochs (1-based, as lr_decay_epochs) after which the batch grows",
                         type=tuple[int, ...], low=1),
        "factor": Option(5.0, "the batch is multiplied by this at each of those epochs (1: kept)",
                         low=1.0)}

    def __init__(self, epochs: tuple[int, ...] | list[int], factor: float = 5.0) -> None:
        if not epochs:
            raise ComponentError("event 'batch_growth': option 'epochs' lists no epoch "
                                 "(the epochs after which the batch grows)")
        if any(e < 1 for e in epochs):
            raise ComponentError(f"event 'batch_growth': epochs count from 1, got {list(epochs)}")
        if factor < 1:
            raise ComponentError(f"event 'batch_growth': factor must be at least 1 (the batch "
                                 f"grows), got {factor}")
        self.epochs = tuple(sorted(epochs))
        self.factor = float(factor)
        self.base: int | None = None

    def batch_size(self, epoch: int) -> int:
        """The batch of epoch ``epoch`` (0-based): the base times ``factor`` for each boundary
        passed, as ``step_table`` counts them for the learning rate."""
        assert self.base is not None, "on_train_begin sets the base batch"
        grown = sum(epoch >= e for e in self.epochs)
        return max(1, round(self.base * self.factor ** grown))

    def on_train_begin(self, trainer: Trainer | Any) -> None:
        if self.base is None:  # the recipe's batch (fit may be called again on the trainer)
            self.base = trainer.sampler.batch_size

    def on_epoch_begin(self, trainer: Trainer | Any, epoch: int) -> None:
        trainer.sampler.batch_size = self.batch_size(epoch)

    def on_epoch_end(self, trainer: Trainer | Any, metrics: dict[str, Any]) -> None:
        # Reported with the epoch's metrics (logs, metrics.json): what "fewer steps" is about.
        metrics["batch_size"] = trainer.sampler.batch_size
        metrics["steps"] = trainer.step


def _no_epochs(values: dict[str, Any]) -> list[str]:
    """Refused with the recipe, before any data is loaded."""
    return [] if values["epochs"] else ["option 'epochs' lists no epoch (the epochs after "
                                        "which the batch grows)"]


EVENTS.add("batch_growth", BatchGrowth, validate=_no_epochs)
