"""The common interface of distributed optimizers (Level 3 strategies).

A strategy wraps any Level 2 ``Optimizer`` (it never re-implements one) and exposes the same
``step(grads)``, ``params`` and ``state``, plus ``finish()`` at the end of training. On
construction it moves the parameters into one persistent flat buffer (``optimizer.params``
entries become views of it) and broadcasts the source rank's values, so every rank starts
equal; gradients are packed into a second flat buffer, so an exchange is one (chunked)
collective, not one per tensor. Each step records its phases in ``timeline`` and counts
``bytes_sent``: the bytes this rank hands to MPI as send buffers.

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> from meta.lv3.data_parallel.allreduce import Allreduce
>>> opt = Allreduce(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist(), opt.bytes_sent
([0.8], 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping

import numpy as np

from meta.common import threads as _threads
from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import Optimizer, Params, State
from meta.lv2.updater import Updater
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.comm.costmodel import Link
from meta.lv3.flat import FlatBuffer
from meta.lv3.timeline import Timeline
from meta.lv3.workload import Workload

if TYPE_CHECKING:
    from meta.lv2.trainer import Trainer

# Chunk size of the fused allreduce, from benchmarks/chunk_sweep.py on the 2-core dev machine
# (MPICH 4 shared memory, 2.7 MB of MLP gradients, best of 20): see the sweep's docstring.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024


class Strategy:
    """Base class: flat buffers, initial broadcast, chunked allreduce, timeline and bytes.

    Subclasses set ``name`` and implement ``step``; ``consistent`` says whether replicas are
    identical after every step; ``role`` is "worker" (trains) or "server" (``serve``s only).
    """

    name: ClassVar[str] = ""
    """The name a recipe gives (``distributed: {"name": ...}``) and reports show."""
    consistent: bool = True
    """Whether every replica holds the same parameters after every step (allreduce: yes;
    local SGD between averages, Downpour, Hogwild: no). Where not, ``train`` evaluates the
    test set again after ``finish`` made them agree."""
    role: str = "worker"
    """This rank's part: "worker" (trains: ``step``) or "server" (``serve`` only, no
    training); set per rank by strategies with servers."""
    options: ClassVar[dict[str, Option]] = {
        "chunk_bytes": Option(DEFAULT_CHUNK_BYTES, "bytes per allreduce chunk "
                              "(benchmarks/chunk_sweep.py)", low=1)}
    """What a recipe may set (``distributed: {"name": ..., option: value}``), declared here;
    ``meta components`` lists them. A subclass that calls ``average`` extends it
    (``{**Strategy.options, ...}``); one that never does declares its own without
    ``chunk_bytes``, so a recipe cannot set what would do nothing."""
    pretraining: ClassVar[str] = "replicate"
    """How a deep belief network pre-trains under this strategy (meta.lv3.pretraining):
    "average" (synchronous, statistics averaged), "exchange" (asynchronous, through the
    strategy's servers) or "replicate" (every rank the same stack from the same seed)."""
    takes_line_search: ClassVar[bool] = False
    """Whether it can run a line-search optimizer (L-BFGS, CG) on several ranks (Sandblaster
    does; ``check`` refuses the others)."""
    evaluates_rows: ClassVar[bool] = False
    """Whether it trains by ``step_rows`` (Sandblaster: batches evaluated by workers as it
    hands them out), not by ``step`` on this rank's gradients."""
    trainer_executor: Any = None
    """The executor the trainer runs under this strategy: a model-parallel one runs the
    trainer's graph its own way (a pipeline's stages, partitioned layers); None: the
    trainer's."""
    end_comm: Communicator | None = None
    """The ranks that finished the run, where a worker died (survived under ULFM); None:
    all."""
    needs_workload: ClassVar[bool] = False
    """Whether it is built from the run's graph (cuts or partitions it), so it needs a
    workload, not only an optimizer: model-parallel strategies."""

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator,
                    workload: Workload | None, **options: Any) -> Strategy:
        """The strategy a recipe names, around the run's optimizer (a collective), built from
        what it uses: the optimizer, the communicator and (where it needs them) the
        ``workload``'s graph, data and names; never the trainer."""
        return cls(optimizer, comm, **options)

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        """Refuse, before any collective, what this strategy cannot run: ``optimizer`` (the
        trainer's stepper) on ``comm``'s ranks with ``workload``."""
        if optimizer.needs_closure and comm.size > 1 \
                and not cls.takes_line_search:
            raise ComponentError(f"distributed {cls.name!r} cannot run a line-search optimizer "
                                 f"on {comm.size} ranks: L-BFGS and CG need every evaluation "
                                 f"of the whole batch (use distributed 'sandblaster' for "
                                 f"L-BFGS, or one process)")

    @property
    def needs_closure(self) -> bool:
        """On one process a line-search optimizer steps through the strategy unchanged."""
        return self.optimizer.needs_closure

    def updater(self) -> StrategyUpdater:
        """How the trainer updates under this strategy (``Trainer.use`` takes it)."""
        return StrategyUpdater(self)

    def train(self, trainer: Trainer, epochs: int) -> list[dict[str, Any]]:
        """This rank's part of training: workers fit (then agree on one model through
        ``finish``), servers serve. Returns the history this rank saw (servers: none)."""
        if self.role == "server":
            self.serve()
            return []
        history = trainer.fit(epochs)
        self.timeline.end_steps()  # finish's exchange is not a step's (Timeline.end_steps)
        self.finish()
        if not self.consistent and trainer.test_data is not None:  # replicas now agree
            history[-1].update(trainer.evaluate(trainer.test_data, prefix="test_"))
        return history

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeline: Timeline | None = None) -> None:
        self.optimizer = optimizer
        """The wrapped Level 2 optimizer: ``self.optimizer.step(grads)`` applies an update to
        this rank's parameters (a strategy decides which gradients, and when)."""
        self.comm = world() if comm is None else comm
        """Every rank of the run (``meta.lv3.comm.Communicator``): servers and workers."""
        self.group = self.comm
        """The ranks that train (and evaluate): ``comm``, or the workers' part of it in a
        strategy with servers. Metrics and ``sync_state`` are summed over it."""
        self.timeline = Timeline() if timeline is None else timeline
        """This rank's step phases: ``step`` calls ``timeline.begin()`` first, then
        ``timeline.lap(phase)`` after each phase ("pack", "communicate", "unpack", "update");
        the run's phase report and Chrome trace read it (``meta.lv3.timeline``)."""
        self.flat_params = FlatBuffer.adopt(optimizer.params)
        """The parameters in one contiguous buffer: ``flat_params.buffer`` is 1-D (every
        parameter, in ``optimizer.params``' order) and ``optimizer.params[name]`` is a view
        of it (``flat_params.views``), so an update through either is seen by both. Exchange
        ``flat_params.buffer`` to exchange the whole model in one message."""
        self.flat_grads = FlatBuffer(self.flat_params.shapes, self.flat_params.dtype)
        """A buffer laid out as ``flat_params`` for the gradients: ``flat_grads.pack(grads)``
        copies a step's gradients into it and returns ``flat_grads.buffer``; the optimizer
        can step on ``flat_grads.views``."""
        self.param_chunks = self.flat_params.chunks(chunk_bytes)
        """``flat_params.buffer`` cut into consecutive views of at most ``chunk_bytes``
        (views, not copies: they cover the buffer once). ``average(param_chunks,
        flat_params.buffer)`` averages the parameters with one nonblocking allreduce per
        chunk."""
        self.grad_chunks = self.flat_grads.chunks(chunk_bytes)
        """``flat_grads.buffer`` cut as ``param_chunks`` cuts the parameters."""
        self.bytes_sent = 0
        """Bytes this rank handed to MPI as send buffers in training (``finish``'s final
        exchange included; ``sync_state``'s apart, in ``state_bytes_sent``): add
        ``buffer.nbytes`` once per call that sends it (an allreduce of it: once; an isend of
        it to each of two neighbours: twice), whatever MPI then moves (an allreduce's internal
        ring traffic is not counted, nor what this rank receives).
        ``average`` and the built-in exchanges add their own: a strategy that calls
        ``average`` must not add the same buffer again (double counting). The report divides
        it by the steps begun (``bytes_sent_per_step``)."""
        self.state_bytes_sent = 0
        """Bytes ``sync_state`` averaged (BatchNorm statistics before each evaluation), apart
        from the per-step exchange in ``bytes_sent``."""
        self.oversubscribed = _threads.local_ranks() > _threads.cores()
        """Whether this node runs more ranks than it has cores. One blocking Allreduce is the
        fastest exchange of one chunk on dedicated cores (200 KB at -n 2: 0.5 ms with packing,
        Iallreduce + Wait 3 ms; benchmarks/fusion.py), but with more ranks than cores MPICH's
        blocking call spins against descheduled peers: 1 MiB took 1.9 s at -n 4 on 2 cores,
        Iallreduce + Wait 24 ms (benchmarks/chunk_sweep.py); ``average`` then uses the
        nonblocking one."""
        self.comm.bcast(self.flat_params.buffer, root=self.source)

    @property
    def source(self) -> int:
        """The rank whose initial parameters every rank starts from."""
        return 0

    @classmethod
    def replica(cls, rank: int, size: int, **options: Any) -> tuple[int, int]:
        """(index among the training ranks, their number) for ``rank`` of ``size``: the data
        shard to take. Pure arithmetic, so it can be asked before any collective."""
        return rank, size

    @property
    def params(self) -> Params:
        return self.optimizer.params

    @property
    def state(self) -> State:
        return self.optimizer.state

    def state_dict(self) -> dict:
        """The wrapped optimizer's state, for checkpoints (replicas hold the same one; a
        compressor's error-feedback residual is per rank and starts afresh on resume)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, saved: dict) -> None:
        self.optimizer.load_state_dict(saved)

    def step(self, grads: Params) -> None:
        raise NotImplementedError(f"{type(self).__name__}.step")

    def step_with(self, executor: Any, feeds: dict, loss: str = "loss",
                  outputs: list[str] | None = None) -> dict:
        """One training step: the executor's forward and backward, then ``step``; returns the
        values. A strategy that can start communicating during the backward overrides it."""
        values, grads = executor.inference_and_backprop(feeds, loss=loss, outputs=outputs)
        self.step(grads)
        return values

    def step_rows(self, rows: np.ndarray) -> tuple[float, int]:
        raise TypeError(f"{type(self).__name__} steps on a batch's gradients, not on rows "
                        "evaluated elsewhere (step_rows)")

    def finish(self) -> None:
        """End of training (collective over ``comm``): leave every replica with the same model."""

    def serve(self) -> None:
        raise RuntimeError(f"{type(self).__name__}: rank {self.comm.rank} has no server role")

    def predict_comm_s(self, link: Link) -> float:
        """Modelled communication time of one step, in seconds."""
        raise NotImplementedError(f"{type(self).__name__}.predict_comm_s")

    def average(self, chunks: list[np.ndarray], buffer: np.ndarray) -> None:
        """Mean of ``buffer`` over ``comm``, one nonblocking allreduce per chunk of it
        (``chunks``: views covering ``buffer``, e.g. ``param_chunks``). Counts
        ``buffer.nbytes`` once in ``bytes_sent`` and laps "communicate" and "unpack" on the
        timeline: the caller adds neither. Nothing on one process."""
        if self.comm.size == 1:
            return
        if len(chunks) == 1 and not self.oversubscribed:
            self.comm.allreduce(buffer)
        else:
            self.comm.waitall([self.comm.iallreduce(chunk) for chunk in chunks])
        self.bytes_sent += buffer.nbytes
        self.timeline.lap("communicate")
        buffer *= 1.0 / self.comm.size
        self.timeline.lap("unpack")

    def sync_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Make the training replicas' state (BatchNorm's running statistics) agree: each
        becomes its mean over ``group``, in place. The trainer calls this before every
        evaluation, so all replicas evaluate, checkpoint and export the same network.

        Averaging rather than DDP's broadcast of rank 0's buffers before every forward: each
        replica's statistics saw only its shard, and their mean estimates the whole data's;
        once per epoch instead of once per step, so the step's exchange carries gradients only
        (``state_bytes_sent`` counts these bytes apart). A collective over ``group``.
        """
        if self.group.size == 1 or not state:
            return
        dtype = np.result_type(*state.values())
        buffer = np.concatenate([np.asarray(v, dtype).ravel() for v in state.values()])
        self.group.allreduce(buffer)
        buffer *= 1.0 / self.group.size
        self.state_bytes_sent += buffer.nbytes
        offset = 0
        for value in state.values():
            value[...] = buffer[offset : offset + value.size].reshape(value.shape)
            offset += value.size

    def report_text(self) -> str:
        """What the run's report prints beyond the figures (Downpour's staleness, a pipeline's
        bubble); nothing by default."""
        return ""

    def report(self) -> dict[str, float]:
        """Bytes sent per step and, per phase, its share of the time and its ms per step."""
        steps = max(self.timeline.steps, 1)
        out = {"bytes_sent_per_step": self.bytes_sent / steps,
               "state_bytes_sent": float(self.state_bytes_sent)}
        for phase, s in self.timeline.summary().items():
            out[f"{phase}_share"] = s["share"]
            out[f"{phase}_ms_per_step"] = s["per_step_s"] * 1e3
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.flat_params.views)} tensors, "
                f"{self.flat_params.nbytes} bytes, {self.comm!r})")


class StrategyUpdater(Updater):
    """The trainer's updater under ``strategy``: its step (which may overlap the backward with
    the exchange, ``step_with``), its rows, its state sync, and metric sums over the ranks that
    train (its ``group``); the executor it brings and its timeline."""

    def __init__(self, strategy: Strategy) -> None:
        group = strategy.group
        super().__init__(strategy, lambda sums: group.allreduce(np.array(sums)),
                         strategy.trainer_executor, strategy.timeline)
        self.strategy = strategy
        """The strategy the trainer steps through."""
        self.evaluates_rows = strategy.evaluates_rows
        """The strategy's ``evaluates_rows``: the trainer hands it batches' rows."""

    def step(self, executor: Any, feeds: dict[str, np.ndarray], loss: str,
             outputs: Iterable[str]) -> dict[str, np.ndarray]:
        if self.strategy.needs_closure:  # one process: the line search as it is
            return super().step(executor, feeds, loss, outputs)
        return self.strategy.step_with(executor, feeds, loss=loss, outputs=list(outputs))

    def step_rows(self, indices: np.ndarray) -> tuple[float, int]:
        return self.strategy.step_rows(indices)

    def sync_state(self, executor: Any) -> None:
        self.strategy.sync_state(executor.graph.state)
