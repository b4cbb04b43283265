"""Running a recipe: build the components it names, hand them to the trainer, measure, judge.

Composition only: every model, dataset, optimizer, executor, strategy, event and metric is a
component that builds itself from its options (``meta.common.component``); what differs between them
(a DBN's pre-training, a parameter server's serving loop, Sandblaster's rows) is behind their
own interfaces (``prepare``, ``Strategy.train``, ``Strategy.from_recipe``), not here.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from meta.common.component import ComponentError
from meta.run.errors import SIGNALS, Interrupted, keep_traceback, user_code, user_error
from meta.lv1 import Graph, build_model
from meta.lv2 import (
    METRICS,
    CheckpointEvent,
    CSVLog,
    EpochLog,
    Event,
    JSONLinesLog,
    PlotMetrics,
    ProgressBar,
    ShuffleSampler,
    Trainer,
    build_dataset,
    build_optimizer,
    load_checkpoint,
)
from meta.lv2.checkpoint import CheckpointError, restore, vocabulary_digest
from meta.lv2.dataset_registry import as_model_input, classes, model_dtype
from meta.lv3 import Communicator, DistributedSampler, Strategy, Workload, world
from meta.lv3.comm.survival import hand_over_outputs
from meta.lv3.pretraining import PretrainingPlan, plan
from meta.lv3.report import communication_report
from meta.run.preflight import check_events, check_model_and_data, check_ranks
from meta.run.recipe import Outcome, Recipe, RecipeError, judge
from meta.run.run_dir import RunDirError, RunLock, output_folder, write_outputs

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
        data = self.choice("dataset")
        with user_code(f"dataset {data.name!r}", "dataset", "while loading the data"):
            train, test, augment = build_dataset(data.component, data.options, d.seed)
        model = self.choice("model")
        with user_code(f"model {model.name!r}", "model", "while building the model"):
            self.model = build_model(model.component, model.options, train.inputs.shape[1:],
                                     classes(train, test), d.seed, model_dtype(train))
            getattr(self.model, "check", lambda data: None)(train)
        graph = getattr(self.model, "graph", self.model)
        fed = next((t for t in graph.inputs if t.name == io_names(graph)["input"]), None)
        train, test = (as_model_input(s, getattr(fed, "dtype", None)) for s in (train, test))
        for note in check_model_and_data(self.recipe.name, model.name, data.name, graph, train,
                                         test, d.batch_size, io_names(graph)):
            if comm.is_root:
                print(f"meta: {note}", file=self.stream, flush=True)
        executor = self.choice("executor")
        with user_code(f"executor {executor.name!r}", "executor", "while building it"):
            executor = executor.build(graph)
        sampler = make_sampler(len(train), d, index, replicas)
        optimizer = self.choice("optimizer")
        with user_code(f"optimizer {optimizer.name!r}", "optimizer", "while building it"):
            built = build_optimizer(optimizer.component, optimizer.options, graph.parameters,
                                    len(sampler), d.epochs)
        self.progress_check = NothingLearned()
        self.train_data = train  # the writer's events (built next) read its vocabulary
        events = self._events(data.name, train)
        trainer = Trainer(executor, built, train, sampler, test,
                          [*events, self.progress_check, StopOnSignal()],
                          eval_batch_size=d.eval_batch_size, names=io_names(graph),
                          sum_across=lambda s: comm.allreduce(np.array(s, dtype=np.float64)),
                          eval_shard=(index, replicas), transform=augment,
                          output_dir=self.output_dir)
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
        """What the rank that writes the outputs runs: the progress bar, the epoch lines,
        logs, curves and checkpoints."""
        d, out = self.recipe.definitions, self.output_dir
        events = [ProgressBar(disable=None if self.progress else True), EpochLog(self.stream)]
        if out is not None:
            events += [CSVLog(out / "metrics.csv"), JSONLinesLog(out / "metrics.jsonl"),
                       PlotMetrics(out / "curves.png", title=self.recipe.name),
                       CheckpointEvent(out / CHECKPOINT, self.checkpoint_every,
                                       info={"recipe": self.recipe.name,
                                             "definitions": d.as_dict(),
                                             **self._vocabulary_info()})]
        return events

    def _vocabulary_info(self) -> dict[str, Any]:
        """A language model's vocabulary as a checkpoint keeps it (kind, size, digest of the
        ids' meaning), so that ``--resume`` on another corpus is refused; {} without one."""
        vocabulary = getattr(self.train_data, "vocabulary", None)
        if vocabulary is None:
            return {}
        return {"vocabulary": {"kind": getattr(vocabulary, "kind", type(vocabulary).__name__),
                               "size": len(vocabulary), "digest": vocabulary_digest(vocabulary)}}

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
        try:
            ckpt = load_checkpoint(path)
        except CheckpointError:
            raise
        except Exception as err:  # zipfile's and zlib's other complaints about a damaged file
            raise CheckpointError(f"{path}: not a readable meta checkpoint ({type(err).__name__}"
                                  f": {err}); resume from another checkpoint, or start again "
                                  f"without --resume") from err
        _check_position(path, ckpt.position)
        saved, now = ckpt.info.get("definitions", {}), self.recipe.definitions.as_dict()
        run_length = {"events"} | ({"epochs"} if now.get("optimizer.lr_schedule") != "cosine"
                                   else set())
        changed = sorted(k for k, v in now.items()
                         if k in saved and saved[k] != v and k not in run_length)
        if changed:
            raise CheckpointError(f"{path} was written by a run with other definitions "
                                  f"({', '.join(f'{k}: {saved[k]!r}' for k in changed)}); "
                                  f"resume with the same recipe and --set values")
        saved_vocabulary, vocabulary = ckpt.info.get("vocabulary"), self._vocabulary_info()
        if "vocabulary" in ckpt.info and saved_vocabulary != vocabulary.get("vocabulary"):
            raise CheckpointError(f"{path} was trained on another vocabulary "
                                  f"({_vocabulary_text(saved_vocabulary)}) than this run's "
                                  f"corpus gives ({_vocabulary_text(vocabulary.get('vocabulary'))}"
                                  f"): its token ids would mean other characters; resume with "
                                  f"the corpus it was trained on, or start again without "
                                  f"--resume")
        done, epochs = int(ckpt.position["epoch"]), self.recipe.definitions.epochs
        if epochs < done:
            raise CheckpointError(f"{path} has {done} epoch(s) done and epochs is {epochs}; "
                                  f"resume with --set epochs={done + 1} or more (epochs is "
                                  f"the run's total), or start again without --resume")
        graph = self.trainer.executor.graph
        network = {**graph.parameters, **graph.frozen, **graph.state}
        saved = {**ckpt.params, **ckpt.state}
        changed = [f"{k!r} is {np.asarray(v).dtype} in the checkpoint, {network[k].dtype} in "
                   f"the network" for k, v in saved.items()
                   if k in network and np.asarray(v).dtype != network[k].dtype]
        if changed:
            more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
            raise CheckpointError(f"{path}: {'; '.join(changed[:3])}{more}; resume with the "
                                  f"dtype it was trained in, or start again without --resume")
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
        metrics.update(train_time_s=float(train_time), **self.build_metrics)
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
        """The recipe's metric components (top-k accuracy, a class's recall, ...), computed by
        the ranks that train and shared with every rank; and the first metric that raised or
        returned no number (its metric is then missing: the run is not passed), or None."""
        wanted = {k: t for k, t in self.recipe.metrics.items() if k in METRICS}
        values: dict[str, float] = {}
        failed: BaseException | None = None
        if strategy.role == "worker":
            for key, threshold in wanted.items():
                try:
                    with user_code(f"metric {key!r}", f"METRICS[{key!r}]", "after training"):
                        values[key] = _number(METRICS[key].build(**threshold.options)
                                              .compute(self.trainer, history))
                except Exception as err:  # noqa: BLE001 - reported once the outputs are out
                    failed = failed or err
        if not wanted:
            return {}, None
        values, failed = self.comm.bcast_obj((values, _portable(failed)), root=0)
        return values, failed


def _check_position(path: Path, position: Any) -> None:
    """The checkpoint's loop position has the types the trainer reads (an edited file is a
    CheckpointError naming the field, not a ValueError from deep inside)."""
    counts = ("epoch", "step", "batch_in_epoch")
    wrong = [f"position.{k}" for k in counts
             if not isinstance(position.get(k), int) or isinstance(position.get(k), bool)
             or position[k] < 0]
    sums = position.get("epoch_sums")
    if not (isinstance(sums, list) and len(sums) == 3 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in sums)):
        wrong.append("position.epoch_sums")
    elapsed = position.get("epoch_elapsed")
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool):
        wrong.append("position.epoch_elapsed")
    history = position.get("history")
    if not (isinstance(history, list) and all(isinstance(m, dict) for m in history)):
        wrong.append("position.history")
    if wrong:
        raise CheckpointError(f"{path}: {', '.join(wrong)} do(es) not hold what a checkpoint "
                              f"writes (a damaged or edited file); resume from another "
                              f"checkpoint, or start again without --resume")


def _vocabulary_text(info: Any) -> str:
    """A checkpoint's record of a vocabulary in words."""
    if not isinstance(info, dict):
        return "none"
    return (f"{info.get('kind')}, {info.get('size')} tokens, digest "
            f"{str(info.get('digest'))[:8]}")


def _number(value: Any) -> float:
    """A metric's value as a float; anything else names what it was."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            and not (isinstance(value, np.ndarray) and value.size == 1):
        raise TypeError(f"compute() returned {type(value).__name__} {value!r}, not a number")
    return float(value)


def _portable(err: BaseException | None) -> BaseException | None:
    """``err`` as it can travel to other ranks (pickled): the marked original when it
    pickles, else its one-line UserCodeError text."""
    if err is None:
        return None
    user = user_error(err)
    try:
        import pickle

        pickle.dumps(err)
        return err
    except Exception:  # noqa: BLE001 - unpicklable user exceptions
        return RuntimeError(str(user or err))


class NothingLearned(Event):
    """Notes whether training changed anything: the parameters against a copy taken at the
    start, and the step losses against the first. ``verdict()`` is one warning line per kind
    of nothing (a strategy whose step updates nothing, a learning rate of 0), printed at the
    end of the run; a model with no trainable parameter is refused before training."""

    priority = -1_000

    def __init__(self) -> None:
        self.start: dict[str, np.ndarray] = {}
        self.first: float | None = None
        self.loss_changed = False
        self.steps = 0
        self.names: list[str] = []

    def on_train_begin(self, trainer: Trainer) -> None:
        params = trainer.executor.graph.parameters
        self.start = {k: np.array(v, copy=True) for k, v in params.items()}

    def on_step_end(self, trainer: Trainer, observation: dict[str, Any]) -> None:
        loss = float(observation["loss"])
        self.steps += 1
        if self.first is None:
            self.first = loss
        elif loss != self.first:
            self.loss_changed = True

    def on_train_end(self, trainer: Trainer) -> None:
        params = trainer.executor.graph.parameters
        self.names = [k for k, v in self.start.items() if k in params and
                      np.array_equal(np.asarray(params[k]), v)]

    def verdict(self) -> list[str]:
        """Lines saying why the run learned nothing (no parameter moved, a constant loss); empty
        when it learned."""
        lines = []
        if self.start and self.steps and len(self.names) == len(self.start):
            lines.append(f"training did nothing: none of the {len(self.start)} parameter "
                         f"tensors moved in {self.steps} step(s) (does the strategy's step "
                         f"update them? is the learning rate 0?)")
        if self.steps > 1 and not self.loss_changed:
            lines.append(f"the training loss never changed in {self.steps} steps "
                         f"({self.first:.6g} at every step)")
        return lines


class StopOnSignal(Event):
    """Where SIGINT/SIGTERM stops a training run: at the first step boundary after the signal
    (``meta.run.errors.SIGNALS``), after a checkpoint of exactly that step (rank 0, which writes
    the outputs), so ``--resume`` continues from it. Runs last of all events."""

    priority = -10_000

    def on_train_begin(self, trainer: Trainer) -> None:
        SIGNALS.deferring = True

    def on_step_end(self, trainer: Trainer, observation: dict[str, Any]) -> None:
        self.stop_if_asked(trainer)

    def on_epoch_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        self.stop_if_asked(trainer)

    def on_eval_batch(self, trainer: Trainer) -> None:
        # between evaluation batches: the trainer's position is still the epoch's last step,
        # so the checkpoint resumes with this evaluation (it took 7.5-19.6 s to act on)
        self.stop_if_asked(trainer, " (evaluating)")

    def stop_if_asked(self, trainer: Trainer, doing: str = "") -> None:
        """After a SIGINT/SIGTERM, checkpoint (if the run checkpoints) and stop at this step
        boundary."""
        if SIGNALS.pending is None or not SIGNALS.deferring:
            return
        SIGNALS.deferring = False
        where = f"at epoch {len(trainer.history) + 1}, step {trainer.step}{doing}"
        saver = next((e for e in trainer.events if isinstance(e, CheckpointEvent)), None)
        if saver is not None:
            try:
                saver.write(trainer)
                where += f"; checkpoint written to {saver.path} (continue with --resume)"
            except Exception as err:  # noqa: BLE001 - the interrupt is what is reported
                where += f"; no checkpoint written ({err})"
        raise Interrupted(SIGNALS.pending, where)

    def finalize(self, trainer: Trainer) -> None:
        SIGNALS.deferring = False


def run_recipe(recipe: Recipe, comm: Communicator | None = None, **options: Any) -> Outcome:
    """Train and evaluate as the recipe says (``options``: those of ``RecipeRun``); outputs go
    to ``output_dir`` (default ``runs/<recipe name>``)."""
    return RecipeRun(recipe, comm, **options).execute()
