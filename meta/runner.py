"""Running a recipe: build what it names from the four levels, train, measure, judge."""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np

from meta import _threads
from meta.lv1 import EXECUTORS, Graph, mlp, save_onnx
from meta.lv1.models import MODELS as CONV_MODELS
from meta.lv2 import (
    LBFGS,
    ArrayDataset,
    CheckpointEvent,
    ConjugateGradient,
    CSVLog,
    EarlyStopping,
    EpochLog,
    JSONLinesLog,
    Optimizer,
    PlotMetrics,
    ProgressBar,
    ShuffleSampler,
    TimeBudget,
    Trainer,
    chain,
    cifar10,
    clip_by_global_norm,
    cosine_decay,
    fashion_mnist,
    load_checkpoint,
    mnist,
    scale,
    step_table,
    synthetic,
    warmup,
)
from meta.lv2.checkpoint import CheckpointError, restore
from meta.lv2.dbn import DBN, pretrain_dbn, print_progress
from meta.lv2.optimizers import OPTIMIZERS
from meta.lv2.transforms import Compose, Cutout, HorizontalFlip, RandomCrop
from meta.lv3 import (
    Communicator,
    DistributedSampler,
    Strategy,
    chrome_trace,
    make_strategy,
    measure_link,
    replica,
    world,
)
from meta.lv3.sandblaster import TrainerRows
from meta.recipe import Definitions, Outcome, Recipe, RecipeError, judge

CHECKPOINT = "checkpoint.npz"
SYNTHETIC_SIZES = {"train": 20000, "test": 2000}


def _synthetic(split: str, normalize: bool = True) -> ArrayDataset:
    return synthetic(SYNTHETIC_SIZES[split], (1, 28, 28), 10, seed=0, split=int(split == "test"))


DATASETS: dict[str, Callable[..., ArrayDataset]] = {
    "mnist": mnist, "fashion-mnist": fashion_mnist, "cifar10": cifar10, "synthetic": _synthetic}
AUGMENTATIONS = {"crop": lambda: RandomCrop(4), "flip": HorizontalFlip, "cutout": lambda: Cutout(8)}


def _conv_model(build: Callable[..., Graph]) -> Callable[[Definitions, tuple, Any], Graph]:
    return lambda d, shape, dtype: build(input_shape=shape, classes=10, seed=d.seed, dtype=dtype)


# Model builders by recipe name: (definitions, input shape, dtype) -> Graph; conv nets ignore
# ``hidden``.
MODELS: dict[str, Callable[[Definitions, tuple, Any], Graph]] = {
    "mlp": lambda d, shape, dtype: mlp(input_shape=shape, hidden=d.hidden, classes=10,
                                       seed=d.seed, dtype=dtype),
    **{name: _conv_model(build) for name, build in CONV_MODELS.items()},
}


def load_data(d: Definitions) -> tuple[ArrayDataset, ArrayDataset]:
    # A DBN's binary visible units need pixels in [0, 1], not standardized ones.
    normalize = d.model != "dbn"
    train, test = (DATASETS[d.dataset](split, normalize=normalize) for split in ("train", "test"))
    if d.train_samples:
        x, y = train.batch(np.arange(min(d.train_samples, len(train))))
        train = ArrayDataset(x, y)
    return train, test


def learning_rate(d: Definitions, steps_per_epoch: int) -> float | Callable[[int], float]:
    """The recipe's learning rate: a number, or a schedule over steps."""
    lr: float | Callable[[int], float] = d.lr
    if d.lr_schedule == "step":
        lr = step_table(d.lr, list(d.lr_decay_epochs), d.lr_decay_factor, steps_per_epoch)
    elif d.lr_schedule == "cosine":
        lr = cosine_decay(d.lr, d.epochs * steps_per_epoch)
    if d.warmup_epochs:
        lr = warmup(lr, d.warmup_epochs * steps_per_epoch)
    return lr


def make_optimizer(d: Definitions, params: dict, steps_per_epoch: int) -> Any:
    """The recipe's optimizer over ``params``: a registered update rule (given the
    hyperparameters its factory accepts) or a line-search method."""
    if d.optimizer == "lbfgs":
        return LBFGS(params)
    if d.optimizer == "cg":
        return ConjugateGradient(params)
    factory = OPTIMIZERS[d.optimizer]
    offered = {"momentum": d.momentum, "nesterov": d.nesterov, "weight_decay": d.weight_decay}
    accepted = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        offered = {k: v for k, v in offered.items() if k in accepted}
    transform = factory(learning_rate(d, steps_per_epoch), **offered)
    if d.grad_clip:
        transform = chain(clip_by_global_norm(d.grad_clip), transform)
    return Optimizer(transform, params)


def build_graph(d: Definitions, train: ArrayDataset, comm: Communicator,
                stream: TextIO | None) -> tuple[Graph, dict[str, float]]:
    """The network, and metrics of building it. A DBN's graph holds its RBMs as initialised:
    pre-training may be collective, so it waits for ``RecipeRun.pretrain`` (in ``execute``,
    after the ranks have agreed that every input loaded)."""
    x0, _ = train.batch(np.arange(1))
    graph, metrics = _network(d, train, x0)
    try:  # a pattern that matches nothing is a mistake in the recipe, named here
        if d.trainable:
            graph.train_only(*d.trainable)
        if d.frozen:
            graph.freeze(*d.frozen)
    except KeyError as err:
        raise RecipeError(str(err.args[0])) from err
    return graph, metrics


def _network(d: Definitions, train: ArrayDataset, x0: np.ndarray) -> tuple[Graph, dict]:
    if d.model == "dbn":
        lo, hi = float(np.min(train.inputs)), float(np.max(train.inputs))
        if lo < 0 or hi > 1:  # found now, before any rank starts a collective pre-training
            raise RecipeError(f"model 'dbn' has binary visible units and needs inputs in "
                              f"[0, 1]; dataset {d.dataset!r} gives [{lo:.3g}, {hi:.3g}]")
        dbn = DBN.untrained(x0.shape[1:], d.hidden, seed=d.seed)
        return dbn.to_graph(classes=10, seed=d.seed), {}
    return MODELS[d.model](d, x0.shape[1:], x0.dtype), {}


def mean_over_ranks(comm: Communicator) -> Callable[[np.ndarray], np.ndarray]:
    """``average`` for data-parallel RBM pre-training: a buffer's mean over ``comm``, as a new
    array. With more ranks than cores it waits on a nonblocking allreduce instead of MPICH's
    blocking one, which spins against descheduled peers (see ``Strategy.average``)."""
    oversubscribed = _threads.local_ranks() > _threads.cores()

    def average(buf: np.ndarray) -> np.ndarray:
        out = np.array(buf)  # a contiguous copy: the caller's buffer is left alone
        if oversubscribed:
            comm.wait(comm.iallreduce(out))
        else:
            comm.allreduce(out)
        out *= 1.0 / comm.size
        return out

    return average


# Strategies with parameter servers: under them a DBN pre-trains asynchronously too.
ASYNC_PRETRAINING = ("async_parameter_server", "async_rma", "downpour")


def parameter_exchange(d: Definitions, comm: Communicator) -> Callable[[dict], Strategy]:
    """``connect`` for asynchronous RBM pre-training: the recipe's strategy around an optimizer
    that adds each pushed step as it is (``scale(1.0)``; the RBM's own CD rule made the step),
    so workers' CD steps accumulate at the server (a one-sided window under ``async_rma``)."""

    def connect(params: dict[str, np.ndarray]) -> Strategy:
        return make_strategy(d.distributed, Optimizer(scale(1.0), params), comm,
                             servers=d.servers, n_fetch=d.n_fetch, n_push=d.n_push)

    return connect


def build_trainer(recipe: Recipe, comm: Communicator, stream: TextIO | None = None,
                  progress: bool = True, output_dir: Path | None = None,
                  checkpoint_every: int = 0) -> tuple[Trainer, dict[str, float]]:
    d = recipe.definitions
    if d.optimizer in ("lbfgs", "cg") and comm.size > 1 and d.distributed != "sandblaster":
        raise RecipeError(f"optimizer {d.optimizer!r} runs on one process only: its line "
                          f"search needs every evaluation of the whole batch (or "
                          f"distributed 'sandblaster' for L-BFGS)")
    if d.distributed == "sandblaster" and comm.size > 1 and d.augmentation:
        raise RecipeError("'augmentation' cannot be used with distributed 'sandblaster': its "
                          "workers evaluate the stored rows of the batch")
    train, test = load_data(d)
    graph, build_metrics = build_graph(d, train, comm, stream)
    executor = EXECUTORS[d.executor](graph)
    # The ranks that train (all but an asynchronous server) each take a shard of the data.
    replica_index, replicas = replica(d.distributed, comm.rank, comm.size, servers=d.servers)
    if replicas > 1:
        sampler = DistributedSampler(len(train), d.batch_size, replica_index, replicas, d.seed)
    else:
        sampler = ShuffleSampler(len(train), d.batch_size, d.seed)
    optimizer = make_optimizer(d, graph.parameters, len(sampler))
    # Events that stop training run on every rank and decide alike (summed metrics, an agreed
    # clock); those that only write run on rank 0.
    events: list[Any] = []
    if d.early_stopping_patience:
        events.append(EarlyStopping("test_loss", d.early_stopping_patience))
    if d.time_budget_s:
        events.append(TimeBudget(d.time_budget_s, check_every=1 if comm.size == 1 else 10))
    if comm.is_root:
        events += [ProgressBar(disable=None if progress else True), EpochLog(stream)]
        if output_dir is not None:
            events += [CSVLog(output_dir / "metrics.csv"),
                       JSONLinesLog(output_dir / "metrics.jsonl"),
                       PlotMetrics(output_dir / "curves.png", title=recipe.name),
                       CheckpointEvent(output_dir / CHECKPOINT, checkpoint_every,
                                       info={"recipe": recipe.name,
                                             "definitions": _jsonable(d)})]
    augment = Compose(*(AUGMENTATIONS[a]() for a in d.augmentation)) if d.augmentation else None
    trainer = Trainer(executor, optimizer, train, sampler, test, events,
                      eval_batch_size=d.eval_batch_size,
                      sum_across=lambda sums: comm.allreduce(np.array(sums, dtype=np.float64)),
                      eval_shard=(replica_index, replicas), transform=augment)
    return trainer, build_metrics


def _jsonable(d: Definitions) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(d).items()}


class RecipeRun:
    """A recipe made ready to train: building it loads the data and the network, so every input
    error surfaces here, with no collective call yet (ranks can still agree to stop cleanly);
    ``execute`` wraps the optimizer for data parallelism and trains."""

    def __init__(self, recipe: Recipe, comm: Communicator | None = None,
                 stream: TextIO | None = None, output_dir: str | Path | None = None,
                 progress: bool = True, export_onnx: bool = True, checkpoint_every: int = 0,
                 resume: bool = False) -> None:
        self.recipe = recipe
        self.comm = comm or world()
        self.stream = stream or sys.stdout
        self.output_dir = Path(output_dir) if output_dir is not None else Path("runs") / recipe.name
        self.export_onnx = export_onnx
        self.trainer, self.build_metrics = build_trainer(
            recipe, self.comm, self.stream, progress, self.output_dir, checkpoint_every)
        self.resumed = resume
        if resume:
            self.resume()

    def resume(self) -> None:
        """Continue from ``output_dir/checkpoint.npz`` (every rank reads it: replicas agree)."""
        path = self.output_dir / CHECKPOINT
        ckpt = load_checkpoint(path)
        saved = ckpt.info.get("definitions", {})
        d = self.recipe.definitions
        # How long to train may change (train further); what is trained may not.
        run_length = {"time_budget_s", "early_stopping_patience"}
        if d.lr_schedule != "cosine":  # a cosine schedule spans the epochs
            run_length.add("epochs")
        changed = sorted(k for k, v in _jsonable(d).items()
                         if k in saved and saved[k] != v and k not in run_length)
        if changed:
            raise CheckpointError(f"{path} was written by a run with other definitions "
                                  f"({', '.join(f'{k}: {saved[k]!r}' for k in changed)}); "
                                  f"resume with the same recipe and --set values")
        restore(self.trainer, ckpt, source=str(path))
        if self.comm.is_root:
            position = ckpt.position
            print(f"meta: resuming from {path} at epoch {position['epoch'] + 1}, "
                  f"step {position['step']}", file=self.stream, flush=True)

    def execute(self) -> Outcome:
        """Train and evaluate; rank 0 prints, exports ONNX and writes the metrics."""
        comm, recipe, stream = self.comm, self.recipe, self.stream
        if comm.is_root:
            where = f" on {comm.size} ranks" if comm.size > 1 else ""
            print(f"meta: running recipe {recipe.name}{where}", file=stream, flush=True)
        self.build_metrics.update(self.pretrain())
        strategy = self.distribute()  # a collective: it broadcasts the initial parameters
        start = time.perf_counter()
        history = self.train(strategy)
        train_time = comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]
        metrics = {k: float(v) for k, v in history[-1].items()}
        metrics["train_time_s"] = float(train_time)
        metrics.update(self.build_metrics)
        metrics.update(self.communication_report(strategy))
        outcome = judge(recipe, metrics, history, self.trainer.executor.graph.parameters)
        if comm.is_root:
            self.write_outputs(outcome)
            print(outcome.table(), file=stream, flush=True)
        return outcome

    def pretrain(self) -> dict[str, float]:
        """A DBN's greedy pre-training (Algorithm 2) into the network's first layers; its
        metric ``pretrain_time_s``. Under ``distributed: allreduce`` on several ranks it runs
        data-parallel (each rank a shard of every batch, statistics averaged by allreduce: a
        collective, hence here and not in the constructor); under the parameter-server
        strategies (``ASYNC_PRETRAINING``) asynchronously data-parallel (each worker its own
        shard, CD steps pushed to the server through the strategy); under the others every
        rank pre-trains the whole data from the same seed, so the stacks agree without
        communicating. A resumed run has its weights from the checkpoint already."""
        d, comm = self.recipe.definitions, self.comm
        if d.model != "dbn" or self.resumed:
            return {}
        parallel = comm.size > 1 and d.distributed == "allreduce"
        asynchronous = comm.size > 1 and d.distributed in ASYNC_PRETRAINING
        shard = (comm.rank, comm.size) if parallel else (0, 1)
        if asynchronous:
            shard = replica(d.distributed, comm.rank, comm.size, servers=d.servers)
        if comm.is_root and (parallel or asynchronous):
            how = (f"asynchronously ({d.distributed}): {shard[1]} workers on their own data "
                   f"shards, {comm.size - shard[1]} server(s)" if asynchronous else
                   f"data-parallel on {comm.size} ranks (CD statistics averaged by allreduce)")
            print(f"meta: pre-training {how}", file=self.stream, flush=True)
        dbn = pretrain_dbn(
            self.trainer.train_data, d.hidden, seed=d.seed, epochs=d.pretrain_epochs,
            lr=d.pretrain_lr, k=d.cd_k, batch_size=d.pretrain_batch_size,
            persistent=d.persistent_cd, replica=shard,
            average=mean_over_ranks(comm) if parallel else None,
            connect=parameter_exchange(d, comm) if asynchronous else None,
            progress=print_progress(self.stream) if comm.is_root else None)
        dbn.assign(self.trainer.executor.graph.parameters)
        return {"pretrain_time_s": dbn.time_s}

    def distribute(self) -> Strategy:
        """Wrap the optimizer in the recipe's Level 3 strategy (which moves the graph's
        parameters into its flat buffer, through ``graph.parameters``); metrics are then
        summed over the ranks that train (an asynchronous server does not)."""
        d, trainer = self.recipe.definitions, self.trainer
        if d.distributed == "sandblaster" and self.comm.size > 1:  # L-BFGS with workers
            strategy = make_strategy("sandblaster", trainer.optimizer, self.comm,
                                     servers=d.servers, portions=d.portions,
                                     evaluate=TrainerRows(trainer))
        elif getattr(trainer.optimizer, "needs_closure", False):  # one process (checked before)
            return make_strategy("allreduce", Optimizer(chain(), {}), self.comm)
        else:
            strategy = make_strategy(d.distributed, trainer.optimizer, self.comm,
                                     average_every=d.average_every, compression=d.compression,
                                     topk_ratio=d.topk_ratio, chunk_bytes=d.chunk_bytes,
                                     servers=d.servers, n_fetch=d.n_fetch, n_push=d.n_push,
                                     warm_start_steps=d.warm_start_steps)
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
            state = self.trainer.executor.graph.state
            synced = (f"; state, {state.nbytes()} bytes, averaged at each evaluation: "
                      f"{report.get('state_bytes_sent', 0):.0f} bytes in all" if state else "")
            print(f"meta: {strategy.name} step phases on rank 0 "
                  f"({report['bytes_sent_per_step']:.0f} bytes sent per step{synced})\n"
                  f"{strategy.timeline.format_summary()}\n"
                  f"meta: communication per step: measured "
                  f"{report['comm_measured_ms_per_step']:.3f} ms, predicted "
                  f"{report['comm_predicted_ms_per_step']:.3f} ms ({link})",
                  file=stream, flush=True)
        text = getattr(strategy, "report_text", lambda: "")()  # e.g. Downpour's staleness
        if comm.is_root and text:
            print(text, file=stream, flush=True)
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
