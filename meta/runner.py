"""Running a recipe: build what it names from the four levels, train, measure, judge."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from meta.lv1 import Graph, ReferenceExecutor, mlp, save_onnx
from meta.lv1.models import MODELS as CONV_MODELS
from meta.lv2 import (
    ArrayDataset,
    EpochLog,
    Optimizer,
    ProgressBar,
    ShuffleSampler,
    Trainer,
    fashion_mnist,
    mnist,
    sgd,
)
from meta.lv3 import (
    Communicator,
    DistributedSampler,
    Strategy,
    chrome_trace,
    make_strategy,
    measure_link,
    strategy_class,
    world,
)
from meta.recipe import Definitions, Outcome, Recipe, judge

DATASETS = {"mnist": mnist, "fashion-mnist": fashion_mnist}


def _conv_model(build: Callable[..., Graph]) -> Callable[[Definitions, tuple, Any], Graph]:
    return lambda d, shape, dtype: build(input_shape=shape, classes=10, seed=d.seed, dtype=dtype)


# Model builders by recipe name: (definitions, input shape, dtype) -> Graph; conv nets ignore
# ``hidden``.
MODELS: dict[str, Callable[[Definitions, tuple, Any], Graph]] = {
    "mlp": lambda d, shape, dtype: mlp(input_shape=shape, hidden=d.hidden, classes=10,
                                       seed=d.seed, dtype=dtype),
    **{name: _conv_model(build) for name, build in CONV_MODELS.items()},
}
EXECUTOR_BACKENDS = {"reference": ("numpy",), "native": ("native", "numpy")}


def load_data(d: Definitions) -> tuple[ArrayDataset, ArrayDataset]:
    train, test = DATASETS[d.dataset]("train"), DATASETS[d.dataset]("test")
    if d.train_samples:
        x, y = train.batch(np.arange(min(d.train_samples, len(train))))
        train = ArrayDataset(x, y)
    return train, test


def build_trainer(recipe: Recipe, comm: Communicator, stream: TextIO | None = None,
                  progress: bool = True) -> Trainer:
    d = recipe.definitions
    train, test = load_data(d)
    x0, _ = train.batch(np.arange(1))
    graph = MODELS[d.model](d, x0.shape[1:], x0.dtype)
    executor = ReferenceExecutor(graph, backends=EXECUTOR_BACKENDS[d.executor])
    optimizer = Optimizer(sgd(d.lr, d.momentum, d.nesterov), graph.parameters)
    # The ranks that train (all but an asynchronous server) each take a shard of the data.
    replica, replicas = strategy_class(d.distributed).replica(comm.rank, comm.size)
    if replicas > 1:
        sampler = DistributedSampler(len(train), d.batch_size, replica, replicas, d.seed)
    else:
        sampler = ShuffleSampler(len(train), d.batch_size, d.seed)
    events = [ProgressBar(disable=None if progress else True), EpochLog(stream)] \
        if comm.is_root else []
    return Trainer(executor, optimizer, train, sampler, test, events,
                   eval_batch_size=d.eval_batch_size,
                   sum_across=lambda sums: comm.allreduce(np.array(sums)),
                   eval_shard=(replica, replicas))


class RecipeRun:
    """A recipe made ready to train: building it loads the data and the network, so every input
    error surfaces here, with no collective call yet (ranks can still agree to stop cleanly);
    ``execute`` wraps the optimizer for data parallelism and trains."""

    def __init__(self, recipe: Recipe, comm: Communicator | None = None,
                 stream: TextIO | None = None, output_dir: str | Path | None = None,
                 progress: bool = True, export_onnx: bool = True) -> None:
        self.recipe = recipe
        self.comm = comm or world()
        self.stream = stream or sys.stdout
        self.output_dir = Path(output_dir) if output_dir is not None else Path("runs") / recipe.name
        self.export_onnx = export_onnx
        self.trainer = build_trainer(recipe, self.comm, self.stream, progress)

    def execute(self) -> Outcome:
        """Train and evaluate; rank 0 prints, exports ONNX and writes the metrics."""
        comm, recipe, stream = self.comm, self.recipe, self.stream
        if comm.is_root:
            where = f" on {comm.size} ranks" if comm.size > 1 else ""
            print(f"meta: running recipe {recipe.name}{where}", file=stream, flush=True)
        strategy = self.distribute()  # a collective: it broadcasts the initial parameters
        start = time.perf_counter()
        history = self.train(strategy)
        train_time = comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]
        metrics = {k: float(v) for k, v in history[-1].items()}
        metrics["train_time_s"] = float(train_time)
        metrics.update(self.communication_report(strategy))
        outcome = judge(recipe, metrics, history, self.trainer.executor.graph.parameters)
        if comm.is_root:
            self.write_outputs(outcome)
            print(outcome.table(), file=stream, flush=True)
        return outcome

    def distribute(self) -> Strategy:
        """Wrap the optimizer in the recipe's Level 3 strategy; the network then reads its
        parameters from the strategy's flat buffer, and metrics are summed over the ranks that
        train (an asynchronous server does not)."""
        d, trainer = self.recipe.definitions, self.trainer
        strategy = make_strategy(d.distributed, trainer.optimizer, self.comm,
                                 average_every=d.average_every, compression=d.compression,
                                 topk_ratio=d.topk_ratio, chunk_bytes=d.chunk_bytes)
        trainer.executor.graph.initializers.update(strategy.params)
        trainer.optimizer, group = strategy, strategy.group
        trainer.sum_across = lambda sums: group.allreduce(np.array(sums))
        return strategy

    def train(self, strategy: Strategy) -> list[dict[str, Any]]:
        """Fit (or serve, on a server rank); every rank returns the history rank 0 saw."""
        trainer = self.trainer
        if strategy.role == "server":
            strategy.serve()
            history: list[dict[str, Any]] = []
        else:
            history = trainer.fit(self.recipe.definitions.epochs)
            strategy.finish()
            if not strategy.consistent and trainer.test_data is not None:  # replicas now agree
                history[-1].update(trainer.evaluate(trainer.test_data, prefix="test_"))
        if strategy.group is not self.comm:
            history = self.comm.bcast_obj(history, root=0)
        return history

    def communication_report(self, strategy: Strategy) -> dict[str, float]:
        """Bytes and phase shares of rank 0, and its communication time per step against the
        alpha-beta model's prediction; writes the Chrome trace if the recipe asks (collective)."""
        comm, stream = self.comm, self.stream
        link = measure_link(comm)
        report = strategy.report()
        report["comm_predicted_ms_per_step"] = strategy.predict_comm_s(link) * 1e3
        report["comm_measured_ms_per_step"] = report.get("communicate_ms_per_step", 0.0)
        if self.recipe.definitions.timeline:
            path = chrome_trace(strategy.timeline, comm, self.output_dir / "timeline.json",
                                strategy.role)
            if path is not None:
                print(f"meta: wrote the step timeline to {path}", file=stream, flush=True)
        if comm.is_root and comm.size > 1:
            print(f"meta: {strategy.name} step phases on rank 0 "
                  f"({report['bytes_sent_per_step']:.0f} bytes sent per step)\n"
                  f"{strategy.timeline.format_summary()}\n"
                  f"meta: communication per step: measured "
                  f"{report['comm_measured_ms_per_step']:.3f} ms, predicted "
                  f"{report['comm_predicted_ms_per_step']:.3f} ms ({link})",
                  file=stream, flush=True)
        return report

    def write_outputs(self, outcome: Outcome) -> None:
        out, d = self.output_dir, self.recipe.definitions
        out.mkdir(parents=True, exist_ok=True)
        report = {"recipe": self.recipe.name, "passed": outcome.passed,
                  "metrics": outcome.metrics, "definitions": dict(vars(d)),
                  "history": outcome.history}
        (out / "metrics.json").write_text(json.dumps(report, indent=2, default=list) + "\n")
        if self.export_onnx:
            path = save_onnx(self.trainer.executor.graph, out / "model.onnx", outputs=["logits"])
            print(f"meta: saved {path} and {out / 'metrics.json'}", file=self.stream, flush=True)


def run_recipe(recipe: Recipe, comm: Communicator | None = None, **options: Any) -> Outcome:
    """Train and evaluate as the recipe says (``options``: those of ``RecipeRun``).

    Outputs go to ``output_dir`` (default ``runs/<recipe name>``): ``metrics.json`` and,
    unless ``export_onnx`` is false, the trained network as ``model.onnx``.
    """
    return RecipeRun(recipe, comm, **options).execute()
