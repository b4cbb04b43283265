"""Running a recipe: build the components it names, hand them to the trainer, measure, judge.

Composition only: every model, dataset, optimizer, executor, strategy, event and metric is a
component that builds itself from its options (``meta.common.component``, through the recipe's
``Choice.build``); what differs between them (a DBN's pre-training, a parameter server's
serving loop, Sandblaster's rows) is behind their own interfaces (``prepare``,
``Strategy.train``, ``Strategy.from_recipe``), not here. The run's own parts are modules of
``meta.run`` it composes: ``data_and_model`` (the data and the network, checked against each
other), ``writer_events`` (rank 0's files), ``resume`` (the checkpoint), ``recipe_metrics``
(the metric components), ``nothing_learned`` and ``stop_on_signal`` (its own events).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from meta.common.component import ComponentError
from meta.lv2 import EpochLog, ShuffleSampler, Trainer, build_optimizer
from meta.lv3 import Communicator, DistributedSampler, Strategy, Workload, world
from meta.lv3.comm.survival import hand_over_outputs
from meta.lv3.pretraining import PretrainingPlan, plan
from meta.lv3.report import communication_report
from meta.run.data_and_model import build_data_and_model, io_names
from meta.run.errors import keep_traceback, user_code
from meta.run.memory_budget import MemoryBudgetError, check_memory_budget
from meta.run.nothing_learned import NothingLearned
from meta.run.preflight import check_events, check_ranks
from meta.run.recipe import Outcome, Recipe, RecipeError, judge
from meta.run.recipe_metrics import measure
from meta.run.resume import CHECKPOINT, vocabulary_info
from meta.run.resume import resume as resume_checkpoint
from meta.run.run_dir import RunDirError, RunLock, output_folder, write_outputs
from meta.run.stop_on_signal import StopOnSignal
from meta.run.writer_events import writer_events

__all__ = ["CHECKPOINT", "NothingLearned", "RecipeRun", "StopOnSignal", "io_names",
           "make_sampler", "run_recipe"]


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
        self.unfinished: BaseException | None = None  # a metric that raised after training
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
        """The recipe's choice of a component ``kind`` (``"optimizer"``, ``"model"``, ...)."""
        return self.recipe.definitions.choices[kind]

    def _build(self) -> Trainer:
        d, comm = self.recipe.definitions, self.comm
        strategy = self.choice("distributed")
        check_ranks(self.recipe.name, strategy.component, strategy.values(), comm.size)
        self.strategy_cls: type[Strategy] = strategy.component.meta["cls"]
        # before the data is loaded: a strategy that cannot run on these ranks says so first
        index, replicas = self.strategy_cls.replica(comm.rank, comm.size, **strategy.values())
        made = build_data_and_model(self.recipe, self.stream, comm.is_root)
        train, test, augment, self.model, graph = (made.train, made.test, made.augment,
                                                   made.model, made.graph)
        optimizer = self.choice("optimizer")
        try:  # before the optimizer's state or the strategy's buffers exist
            check_memory_budget(self.recipe.name, d.memory_limit_gb, strategy.name,
                                strategy.values(), graph, optimizer.name, optimizer.values(),
                                comm.size)
        except MemoryBudgetError as err:
            raise RecipeError(str(err)) from None
        executor = self.choice("executor")
        with user_code(f"executor {executor.name!r}", "executor", "while building it"):
            executor = executor.build(graph)
        sampler = make_sampler(len(train), d, index, replicas)
        with user_code(f"optimizer {optimizer.name!r}", "optimizer", "while building it"):
            built = build_optimizer(optimizer.component, optimizer.options, graph.parameters,
                                    len(sampler), d.epochs)
        self.progress_check = NothingLearned()
        self.train_data = train  # the writer's events (built next) read its vocabulary
        events = self._events(self.choice("dataset").name, train)
        trainer = Trainer(executor, built, train, sampler, test,
                          [*events, self.progress_check, StopOnSignal()],
                          eval_batch_size=d.eval_batch_size, names=io_names(graph),
                          sum_across=lambda s: comm.allreduce(np.array(s, dtype=np.float64)),
                          eval_shard=(index, replicas), transform=augment,
                          output_dir=self.output_dir, ema_decay=d.ema_decay,
                          ema_every=optimizer.values().get("accumulate", 1))
        trainer.prints = comm.is_root
        with user_code(f"distributed {strategy.name!r}", "distributed", "while checking it"):
            self.workload = Workload.of(trainer)  # what the strategy is built from
            self.strategy_cls.check(built, comm, self.workload)
        return trainer

    def _events(self, dataset: str, train: Any) -> list[Any]:
        """The recipe's events (on every rank: those that stop training decide alike), checked
        against the training data before any step, then on rank 0 the writer's."""
        d = self.recipe.definitions
        events = []
        for e in d.events:
            with user_code(f"event {e.name!r}", "events", "while building it"):
                events.append(e.build())
        check_events(self.recipe.name, dataset, [(e.name, ev) for e, ev in zip(d.events, events)],
                     train)
        return events + (self._writer_events() if self.comm.is_root else [])

    def _writer_events(self) -> list[Any]:
        return writer_events(self.recipe, self.output_dir, self.stream, self.progress,
                             self.checkpoint_every, self.train_data)

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
        """Continue from the output folder's checkpoint (``meta.run.resume``)."""
        resume_checkpoint(self.trainer, self.output_dir, self.recipe.definitions,
                          vocabulary_info(self.train_data), self.stream, self.comm.is_root)

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
        # evaluation apart: train_time_s is the steps' time, eval_time_s the evaluations'
        train_time, eval_time = comm.allreduce(np.array(
            [time.perf_counter() - start - trainer.eval_time_s, trainer.eval_time_s]), op="max")
        metrics = {k: float(v) for k, v in history[-1].items()}
        trace = self.output_dir / "timeline.json" if recipe.definitions.timeline else None
        metrics.update(train_time_s=float(train_time), eval_time_s=float(eval_time),
                       **self.build_metrics)
        # Every report below is guarded: one that fails is a warning, never a lost output.
        metrics.update(self.report(strategy, comm, trace))
        measured, self.unfinished = self.measured(strategy, history)
        metrics.update(measured)
        outcome = judge(recipe, metrics, history, trainer.executor.graph.parameters)
        if comm.is_root:
            for line in [*self.progress_check.verdict(), *trainer.finalize_failures]:
                self.warn(line)
            write_outputs(self, outcome)  # model.onnx, then metrics.json, each atomically
            print(outcome.table(), file=stream, flush=True)
        return outcome

    def warn(self, line: str, err: BaseException | None = None) -> None:
        """One warning line on the run's stream; with ``err``, its traceback in the output
        folder's error.log."""
        log = keep_traceback(self.output_dir, err) if err is not None else None
        print(f"meta: warning: {line}{f' (traceback in {log})' if log else ''}",
              file=self.stream, flush=True)

    def report(self, strategy: Strategy, comm: Communicator,
               trace: Path | None) -> dict[str, float]:
        """The strategy's communication report; where it fails (a strategy without the
        optional cost model ``predict_comm_s``), a warning and the strategy's own counters
        alone. Every rank fails alike (the same class), so the collective inside stays
        matched."""
        try:
            return communication_report(strategy, comm, self.stream, trace,
                                        self.trainer.executor.graph.state.nbytes())
        except Exception as err:  # noqa: BLE001 - a report is not worth the outputs
            if comm.is_root:
                self.warn(f"no communication report: {type(err).__name__} in distributed "
                          f"{self.choice('distributed').name!r}: {err}", err)
        try:
            return dict(strategy.report())
        except Exception:  # noqa: BLE001 - already warned
            return {}

    def distribute(self) -> Strategy:
        """Wrap the optimizer in the recipe's strategy (which moves the graph's parameters
        into its flat buffer); the trainer then updates through the strategy's updater, which
        sums metrics over the ranks that train."""
        strategy = self.choice("distributed")
        wrapped = strategy.build(self.trainer.optimizer, self.comm, self.workload)
        self.trainer.use(wrapped.updater())
        hand_over_outputs(wrapped.group, self.take_over_outputs)  # rank 0 dies (under ULFM)
        return wrapped

    def measured(self, strategy: Strategy, history: list[dict[str, Any]]
                 ) -> tuple[dict[str, float], BaseException | None]:
        """The recipe's metric components and the first that failed (``recipe_metrics``)."""
        return measure(self.recipe.metrics, self.trainer, history, strategy.role == "worker",
                       self.comm)


def run_recipe(recipe: Recipe, comm: Communicator | None = None, **options: Any) -> Outcome:
    """Train and evaluate as the recipe says (``options``: those of ``RecipeRun``); outputs go
    to ``output_dir`` (default ``runs/<recipe name>``)."""
    return RecipeRun(recipe, comm, **options).execute()
