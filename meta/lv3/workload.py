"""What a strategy is built from besides the optimizer and the communicator: the workload.

A strategy never receives the trainer (issue 40): it is built from what it uses. Data
parallelism needs only the optimizer and the communicator; the others read a few facts of the
training run, gathered here once, typed, by the runner (``Workload.of(trainer)``):

* the executor (its graph, and its kind: a pipeline's stages and a partition's parts run with
  one of the same kind),
* the tensor names (input, labels, logits, loss),
* the training rows (a sample batch on which stages agree on shapes; Sandblaster's rows),
* the batch size, the seed, whether batches are augmented, the steps of an epoch,
* where the evaluation's shard is re-set when workers die (``reshard_evaluation``).

A strategy built around a bare optimizer (``make_strategy``, tests) gets no workload (None);
those that cut the graph refuse that in one line.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from meta.common.component import ComponentError
from meta.lv1.executor import Executor, ReferenceExecutor
from meta.lv1.graph import Graph
from meta.lv2.datasets import Dataset

if TYPE_CHECKING:
    from meta.lv2.trainer import Trainer


@dataclass(frozen=True)
class Workload:
    """The facts of a training run a strategy may be built from (never the trainer)."""

    executor: Executor
    """the network as the trainer runs it"""
    names: Mapping[str, str]
    """"input", "labels", "logits", "loss" -> tensor names"""
    train_data: Dataset
    """rows the stages sample, Sandblaster's workers evaluate"""
    batch_size: int
    """Examples per step on this rank."""
    seed: int
    """the run's seed (a stochastic compressor's stream starts from it)"""
    augmented: bool
    """batches pass through a random transform before the executor"""
    steps_per_epoch: int
    """Steps in an epoch on this rank."""
    reshard_evaluation: Callable[[int, int], None] | None = None
    """(rank, size) of evaluators"""

    @classmethod
    def of(cls, trainer: Trainer) -> Workload:
        """The workload of a Level 2 trainer: the one place a trainer is read for a strategy."""

        def reshard(rank: int, size: int) -> None:
            trainer.eval_shard = (rank, size)

        return cls(trainer.executor, dict(trainer.names), trainer.train_data,
                   trainer.sampler.batch_size, trainer.sampler.seed,
                   trainer.transform is not None, trainer.steps_per_epoch, reshard)

    @property
    def graph(self) -> Graph:
        """The network the strategy distributes."""
        return self.executor.graph

    def sample(self, rows: int) -> dict[str, np.ndarray]:
        """The first ``rows`` training rows as the graph's feeds (input, labels: those the
        graph declares)."""
        x, y = self.train_data.batch(np.arange(min(rows, len(self.train_data))))
        declared = {t.name for t in self.graph.inputs}
        names = self.names
        return {k: v for k, v in ((names["input"], x), (names["labels"], y)) if k in declared}

    def executor_options(self) -> dict[str, Any]:
        """The run's executor's options as it runs them: every option its kind declares
        (``options``, its bases' too: ``meta.common.component``), read from the executor. The
        one list of what an executor of the run's kind is made with (``executor_maker``)."""
        kind = type(self.executor)
        declared = dict.fromkeys(k for c in reversed(kind.__mro__)
                                 for k in getattr(c, "options", {}))
        return {k: getattr(self.executor, k) for k in declared if hasattr(self.executor, k)}

    @property
    def recompute(self) -> Any:
        """The run's activation recomputation (the planned executor's ``recompute``: "blocks"
        or node-name patterns), None when off or where the executor has none."""
        return self.executor_options().get("recompute") or None

    def executor_maker(self, strategy: str = "", recomputes: bool = False
                       ) -> Callable[[Graph], ReferenceExecutor]:
        """Executors of the trainer's kind for other graphs (a pipeline's stages, a
        partition's parts, ZeRO-3's layer groups), made with every option the run's executor
        was (``executor_options``: backends, profiling, memory, precision, ...), so a part
        never runs otherwise than the whole would (bf16 stays bf16).

        Parts run as stages (``forward_saving``/``backward_seeded``), which do not recompute:
        a run asking for ``recompute`` is refused in one line, unless the caller recomputes
        its parts itself (``recomputes``: ZeRO-3 recomputes each layer group), whose parts
        are then made without it."""
        executor, kind = self.executor, type(self.executor)
        options = self.executor_options()
        if options.get("recompute"):
            if not recomputes:
                who = f"distributed {strategy!r}" if strategy else "this distributed strategy"
                raise ComponentError(
                    f"{who} runs the graph's parts as stages, which do not recompute "
                    f"activations: recompute={options['recompute']!r} cannot be honoured "
                    f"(drop recompute, or use allreduce, zero1, zero2 or zero3)")
            options["recompute"] = None
        if "backends" in inspect.signature(kind).parameters:  # not an option: the kind's own
            options["backends"] = executor.backends

        def make(graph: Graph) -> ReferenceExecutor:
            return kind(graph, **options)  # type: ignore[call-arg]

        return make


def required(workload: Workload | None, strategy: str) -> Workload:
    """``workload``, or one line saying that ``strategy`` (one that cuts or partitions the
    run's graph) is built from a recipe (or ``make_strategy(..., workload=...)``), not around
    a bare optimizer."""
    if workload is None:
        raise ComponentError(f"distributed {strategy!r} cuts the run's graph: build it from a "
                             f"recipe (or with a Workload), not around a bare optimizer")
    return workload
