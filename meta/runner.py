"""Running a recipe: build what it names from the four levels, train, measure, judge."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from meta.lv1 import ReferenceExecutor, mlp, save_onnx
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
from meta.lv3 import AllreduceOptimizer, Communicator, DistributedSampler, world
from meta.recipe import Definitions, Outcome, Recipe, judge

DATASETS = {"mnist": mnist, "fashion-mnist": fashion_mnist}
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
    graph = mlp(input_shape=x0.shape[1:], hidden=d.hidden, classes=10, seed=d.seed,
                dtype=x0.dtype)
    executor = ReferenceExecutor(graph, backends=EXECUTOR_BACKENDS[d.executor])
    optimizer = Optimizer(sgd(d.lr, d.momentum, d.nesterov), graph.parameters)
    if comm.size > 1:
        sampler = DistributedSampler(len(train), d.batch_size, comm.rank, comm.size, d.seed)
    else:
        sampler = ShuffleSampler(len(train), d.batch_size, d.seed)
    events = [ProgressBar(disable=None if progress else True), EpochLog(stream)] \
        if comm.is_root else []
    return Trainer(executor, optimizer, train, sampler, test, events,
                   eval_batch_size=d.eval_batch_size,
                   sum_across=lambda sums: comm.allreduce(np.array(sums)),
                   eval_shard=(comm.rank, comm.size))


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
        if comm.size > 1:  # its constructor broadcasts rank 0's parameters: a collective
            self.trainer.optimizer = AllreduceOptimizer(self.trainer.optimizer, comm)
        start = time.perf_counter()
        history = self.trainer.fit(recipe.definitions.epochs)
        train_time = comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]
        metrics = {k: float(v) for k, v in history[-1].items()}
        metrics["train_time_s"] = float(train_time)
        outcome = judge(recipe, metrics, history, self.trainer.executor.graph.parameters)
        if comm.is_root:
            self.write_outputs(outcome)
            print(outcome.table(), file=stream, flush=True)
        return outcome

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
