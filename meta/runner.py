"""Running a recipe: build the components it names, hand them to the trainer, measure, judge.

Composition only: every model, dataset, optimizer, executor, strategy, event and metric is a
component that builds itself from its options (``meta.component``); what differs between them
(a DBN's pre-training, a parameter server's serving loop, Sandblaster's rows) is behind their
own interfaces (``prepare``, ``Strategy.train``, ``Strategy.from_recipe``), not here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from meta.component import ComponentError
from meta.lv1 import Graph, build_model
from meta.lv2 import (
    METRICS,
    CheckpointEvent,
    CSVLog,
    EpochLog,
    JSONLinesLog,
    PlotMetrics,
    ProgressBar,
    ShuffleSampler,
    Trainer,
    build_dataset,
    build_optimizer,
    load_checkpoint,
)
from meta.lv2.checkpoint import CheckpointError, restore
from meta.lv2.dataset_registry import classes
from meta.lv3 import Communicator, DistributedSampler, Strategy, world
from meta.lv3.comm.survival import hand_over_outputs
from meta.lv3.pretraining import PretrainingPlan, plan
from meta.lv3.report import communication_report
from meta.recipe import Outcome, Recipe, RecipeError, judge
from meta.run_dir import RunDirError, RunLock, output_folder, write_outputs

CHECKPOINT = "checkpoint.npz"


def io_names(graph: Graph) -> dict[str, str]:
    """The trainer's tensor names: the data input, the first output (logits) and ``loss``."""
    feeds = [t.name for t in graph.inputs if t.name not in graph.initializers
             and t.name != "labels"]
    logits = [t.name for t in graph.outputs if t.name != "loss"]
    return {"input": feeds[0] if feeds else "input", "logits": logits[0] if logits else "logits"}


def make_sampler(num_examples: int, definitions: Any, index: int,
                 replicas: int) -> ShuffleSampler:
    """The batches replica ``index`` of ``replicas`` trains on: its shard of every shuffled
    epoch, or the whole epoch when there is one replica. ``meta replay`` takes a worker's
    batches from here too, so they are the ones the run's rank took."""
    d = definitions
    if replicas > 1:
        return DistributedSampler(num_examples, d.batch_size, index, replicas, d.seed)
    return ShuffleSampler(num_examples, d.batch_size, d.seed)


class RecipeRun:
    """A recipe made ready to train: building it loads the data and the network, so every input
    error surfaces here, before any collective call (ranks can still agree to stop cleanly);
    ``execute`` distributes the optimizer, trains and judges."""

    def __init__(self, recipe: Recipe, comm: Communicator | None = None,
                 stream: TextIO | None = None, output_dir: str | Path | None = None,
                 progress: bool = True, export_onnx: bool = True, checkpoint_every: int = 0,
                 resume: bool = False, locks: list[RunLock] | None = None) -> None:
        self.recipe, self.comm, self.stream = recipe, comm or world(), stream or sys.stdout
        self.output_dir = output_folder(recipe.name, output_dir)
        self.export_onnx, self.resumed, self.build_metrics = export_onnx, resume, {}
        # The output folder's locks this process holds (``meta run``'s); a rank that takes
        # over writing the outputs from a dead rank 0 adds the one it inherits.
        self.locks = locks
        self.progress, self.checkpoint_every = progress, checkpoint_every
        try:
            self.trainer = self._build()
        except ComponentError as err:
            raise RecipeError(f"recipe {recipe.name!r}: {err}") from err
        if resume:
            self.resume()

    def choice(self, kind: str) -> Any:  # the recipe's Choice of a component kind
        return self.recipe.definitions.choices[kind]

    def _build(self) -> Trainer:
        d, comm = self.recipe.definitions, self.comm
        data = self.choice("dataset")
        train, test, augment = build_dataset(data.component, data.options, d.seed)
        model = self.choice("model")
        self.model = build_model(model.component, model.options, train.inputs.shape[1:],
                                 classes(train, test), d.seed, train.inputs.dtype)
        getattr(self.model, "check", lambda data: None)(train)
        graph = getattr(self.model, "graph", self.model)
        executor = self.choice("executor")
        executor = executor.component.build(graph, **executor.options)
        strategy = self.choice("distributed")
        self.strategy_cls: type[Strategy] = strategy.component.meta["cls"]
        index, replicas = self.strategy_cls.replica(comm.rank, comm.size, **strategy.values())
        sampler = make_sampler(len(train), d, index, replicas)
        optimizer = self.choice("optimizer")
        trainer = Trainer(executor, build_optimizer(optimizer.component, optimizer.options,
                                                    graph.parameters, len(sampler), d.epochs),
                          train, sampler, test, self._events(),
                          eval_batch_size=d.eval_batch_size, names=io_names(graph),
                          sum_across=lambda s: comm.allreduce(np.array(s, dtype=np.float64)),
                          eval_shard=(index, replicas), transform=augment,
                          output_dir=self.output_dir)
        self.strategy_cls.check(trainer, comm)
        return trainer

    def _events(self) -> list[Any]:
        """The recipe's events (on every rank: those that stop training decide alike), then
        on rank 0 the writer's."""
        d = self.recipe.definitions
        events = [e.component.build(**e.options) for e in d.events]
        return events + (self._writer_events() if self.comm.is_root else [])

    def _writer_events(self) -> list[Any]:
        """What the rank that writes the outputs runs: the progress bar, the epoch lines,
        logs, curves and checkpoints."""
        d, out = self.recipe.definitions, self.output_dir
        events = [ProgressBar(disable=None if self.progress else True), EpochLog(self.stream)]
        if out is not None:
            events += [CSVLog(out / "metrics.csv"), JSONLinesLog(out / "metrics.jsonl"),
                       PlotMetrics(out / "curves.png", title=self.recipe.name),
                       CheckpointEvent(out / CHECKPOINT, self.checkpoint_every,
                                       info={"recipe": self.recipe.name,
                                             "definitions": d.as_dict()})]
        return events

    def take_over_outputs(self, dead: int) -> None:
        """Rank 0 (``dead``, a world rank) died and this rank, the first worker alive, writes
        the run's outputs in its place: it inherits the output folder's lock and runs the
        writer's events from now on. Their files are rewritten whole from the trainer's
        history, which every worker holds, so nothing written before the death is lost."""
        epoch = len(self.trainer.history) + 1
        print(f"meta: rank {dead} died; rank {self.comm.rank} writes the run's outputs from "
              f"epoch {epoch} on", file=self.stream, flush=True)
        if self.locks is not None and self.output_dir is not None:
            try:
                self.locks.append(RunLock(self.output_dir, self.stream, holder_died=True))
            except RunDirError as err:
                raise ComponentError(f"rank {self.comm.rank} cannot take over the outputs of "
                                     f"dead rank {dead}: {err}") from err
        print(EpochLog.HEADER, file=self.stream, flush=True)
        self.trainer.add_events(self._writer_events())

    def resume(self) -> None:
        """Continue from ``output_dir/checkpoint.npz`` (every rank reads it: replicas agree).
        How long to train may change; what is trained may not."""
        path = self.output_dir / CHECKPOINT
        ckpt = load_checkpoint(path)
        saved, now = ckpt.info.get("definitions", {}), self.recipe.definitions.as_dict()
        run_length = {"events"} | ({"epochs"} if now.get("optimizer.lr_schedule") != "cosine"
                                   else set())
        changed = sorted(k for k, v in now.items()
                         if k in saved and saved[k] != v and k not in run_length)
        if changed:
            raise CheckpointError(f"{path} was written by a run with other definitions "
                                  f"({', '.join(f'{k}: {saved[k]!r}' for k in changed)}); "
                                  f"resume with the same recipe and --set values")
        restore(self.trainer, ckpt, source=str(path))
        if self.comm.is_root:
            print(f"meta: resuming from {path} at epoch {ckpt.position['epoch'] + 1}, step "
                  f"{ckpt.position['step']}", file=self.stream, flush=True)

    def pretraining_plan(self) -> PretrainingPlan:
        """How a model that pre-trains (a DBN) spreads it over the ranks, as the strategy says."""
        strategy = self.choice("distributed")
        return plan(strategy.component, strategy.values(), self.comm)

    def execute(self) -> Outcome:
        """Prepare the model, distribute, train, measure; rank 0 prints, exports, writes."""
        comm, recipe, stream, trainer = self.comm, self.recipe, self.stream, self.trainer
        if comm.is_root:
            where = f" on {comm.size} ranks" if comm.size > 1 else ""
            print(f"meta: running recipe {recipe.name}{where}", file=stream, flush=True)
        self.build_metrics.update(getattr(self.model, "prepare", lambda run: {})(self))
        strategy = self.distribute()  # a collective: it broadcasts the initial parameters
        start = time.perf_counter()
        history = strategy.train(trainer, recipe.definitions.epochs)
        if strategy.end_comm is not None:  # the ranks left, once workers died
            comm = self.comm = strategy.end_comm
        if strategy.group is not comm:  # a server saw no epochs: take rank 0's
            history = comm.bcast_obj(history, root=0)
        train_time = comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]
        metrics = {k: float(v) for k, v in history[-1].items()}
        trace = self.output_dir / "timeline.json" if recipe.definitions.timeline else None
        metrics.update(train_time_s=float(train_time), **self.build_metrics,
                       **communication_report(strategy, comm, stream, trace,
                                              trainer.executor.graph.state.nbytes()))
        metrics.update(self.measured(strategy, history))
        outcome = judge(recipe, metrics, history, trainer.executor.graph.parameters)
        if comm.is_root:
            write_outputs(self, outcome)  # model.onnx, then metrics.json, each atomically
            print(outcome.table(), file=stream, flush=True)
        return outcome

    def distribute(self) -> Strategy:
        """Wrap the optimizer in the recipe's strategy (which moves the graph's parameters
        into its flat buffer); the trainer then updates through the strategy's updater, which
        sums metrics over the ranks that train."""
        strategy = self.choice("distributed")
        wrapped = strategy.component.build(self.trainer.optimizer, self.comm, self.trainer,
                                           **strategy.options)
        self.trainer.use(wrapped.updater())
        hand_over_outputs(wrapped.group, self.take_over_outputs)  # rank 0 dies (under ULFM)
        return wrapped

    def measured(self, strategy: Strategy, history: list[dict[str, Any]]) -> dict[str, float]:
        """The recipe's metric components (top-k accuracy, a class's recall, ...), computed by
        the ranks that train and shared with every rank."""
        wanted = {k: t for k, t in self.recipe.metrics.items() if k in METRICS}
        values = {k: float(METRICS[k].build(**t.options).compute(self.trainer, history))
                  for k, t in wanted.items()} if strategy.role == "worker" else {}
        return self.comm.bcast_obj(values, root=0) if wanted else {}


def run_recipe(recipe: Recipe, comm: Communicator | None = None, **options: Any) -> Outcome:
    """Train and evaluate as the recipe says (``options``: those of ``RecipeRun``); outputs go
    to ``output_dir`` (default ``runs/<recipe name>``)."""
    return RecipeRun(recipe, comm, **options).execute()
