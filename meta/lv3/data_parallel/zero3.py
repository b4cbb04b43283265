"""ZeRO stage 3 (fully sharded data parallelism) over MPI: parameters sharded by layer groups.

Rajbhandari et al.'s ZeRO-3, PyTorch's FSDP: every rank holds 1/P of each layer group's flat
parameters, of their optimizer state and of their gradients, and nothing else between steps.
The graph is cut into consecutive layer groups (the pipeline's ``partition``, balanced by
parameter count); a step runs them in turn on every rank (each its own batch):

* forward: before a group runs, its parameters are all-gathered (``iallgatherv``) into a
  buffer of their own, the next group's allgather started as it runs (``prefetch``); after
  it, the buffer is freed. What the group's backward will read of
  them (a Gemm keeps its weight) is taken out of the saved contexts and put back from the
  next gather, so the whole model is never held at once;
* backward, last group first: the group's parameters gathered again, its backward run from
  the gradients the next group handed back, its gradients reduce-scattered (nonblocking) into
  this rank's gradient shard as soon as the earliest group that reads them has finished, its
  buffers freed;
* the update: the run's elementwise Level 2 optimizer steps this rank's shard of every group
  (one flat parameter), and that is all: the next forward gathers the new values.

A parameter read by two groups (a language model's head tied to its token embedding) lives in
the first group that reads it; the other gathers that group too, and both add to its gradient.
Before an evaluation (``sync_state``) and at ``finish`` the whole model is gathered into the
graph (evaluation, export and the checkpoint read it), and the optimizer state is gathered on
rank 0 per parameter name: a checkpoint resumes at any rank count, or in one process. The
groups' executors are of the run's kind driven through their tapes, as the pipeline's stages
are (``ReferenceExecutor._forward``/``_run_tape``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv1.executor import Executor
from meta.lv1.gradient_hook import GradientHook
from meta.lv2.optimizers import Optimizer, Params, summed_over
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, ring_allreduce
from meta.lv3.data_parallel.zero import FLAT, _walk, gathered_state_dict, require_shardable
from meta.lv3.flat import FlatBuffer, shard_bounds
from meta.lv3.pipeline.partition import Partition, partition
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload, required


def _placeholder(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` that takes no memory (zeros, read-only): a parameter's place in a
    graph while its values are sharded away."""
    return np.broadcast_to(np.zeros((), dtype), shape)


class _Stashed:
    """Where a saved context held a view of a group's gathered buffer: the view's place in
    it, to be rebuilt from the next gather of that group."""

    __slots__ = ("group", "offset", "shape", "strides", "dtype")

    def __init__(self, group: int, offset: int, a: np.ndarray) -> None:
        self.group, self.offset = group, offset
        self.shape, self.strides, self.dtype = a.shape, a.strides, a.dtype


def _base_of(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Group:
    """One layer group's parameters: their flat layout, each rank's [lo, hi) of it and where
    this rank's part lies in its shard of all groups."""

    def __init__(self, index: int, shapes: dict[str, tuple[int, ...]], dtype: np.dtype,
                 ranks: int, rank: int, offset: int) -> None:
        self.index = index
        """Its place among the groups (the stage of the partition it is the home of)."""
        self.shapes = shapes
        """Its parameters' shapes, in its flat layout's order."""
        self.dtype = dtype
        """The parameters' dtype."""
        self.n = sum(int(np.prod(s)) for s in shapes.values())
        """Values in the group."""
        self.bounds = shard_bounds(self.n, ranks)
        """Each rank's [lo, hi) of the group's flat layout."""
        self.counts = [hi - lo for lo, hi in self.bounds]
        """Each rank's share: the counts of the group's collectives."""
        self.lo, self.hi = self.bounds[rank]
        """This rank's [lo, hi) of the group."""
        self.offset = offset
        """Where this rank's part starts in its shard of every group."""

    def mine(self, shard: np.ndarray) -> np.ndarray:
        """This group's part of a rank's shard (parameters, gradients or a state array)."""
        return shard[self.offset:self.offset + self.hi - self.lo]


class ShardedExecutor(Executor):
    """The trainer's executor under ZeRO-3: the graph's layer groups run in turn, each with
    its parameters all-gathered just before and freed just after (see the module). Every call
    is a collective over the strategy's ranks, except inference while the model is gathered
    whole (``materialize``: evaluations)."""

    def __init__(self, strategy: Zero3, graph: Any, part: Partition, make: Any) -> None:
        self.strategy = strategy
        """The ZeRO-3 strategy whose shards the groups gather from and reduce into."""
        self.graph = graph
        """The whole graph (its parameters hold values only while ``materialize``d)."""
        self.partition = part
        """The layer groups: stages of the graph, run one after another on every rank."""
        self.stage_graphs = [part.stage_graph(graph, s) for s in range(len(part.stages))]
        """Each group's nodes as a graph of their own (initializers shared with ``graph``)."""
        self.executors = [make(g) for g in self.stage_graphs]
        """Each group's executor, of the run's kind, driven through its tape."""
        self.ops = {k: op for ex in self.executors for k, op in ex.ops.items()}
        """Every group's operators (their random state goes into checkpoints)."""
        self.materialized = True
        """Whether ``graph`` holds the whole model (at first, and after ``materialize``)."""
        self.live: dict[int, np.ndarray] = {}
        """Group -> its gathered parameters, while in use."""
        self.pending: dict[int, tuple[Any, np.ndarray]] = {}
        """Group -> its allgather under way and the buffer it fills (``prefetch``)."""
        self._laps = False

    # -- the executor interface --------------------------------------------------------------

    def _mode_changed(self) -> None:
        for ex in self.executors:
            ex.train(bool(self.training))

    def placement(self) -> dict[str, str]:
        return {k: v for ex in self.executors for k, v in ex.placement().items()}

    def inference(self, feeds: dict, outputs: Iterable[str] | None = None) -> dict:
        """The graph's ``outputs`` for ``feeds``: from the gathered model where it is whole
        (evaluation), else group by group (a collective)."""
        names = list(outputs) if outputs is not None else list(self.partition.outputs)
        values, _ = self._forward(feeds, names, training=False)
        return values

    def inference_and_backprop(self, feeds: dict, loss: str = "loss",
                               outputs: Iterable[str] | None = None, micro_batches: int = 1,
                               wrt: Sequence[str] = (), hook: GradientHook | None = None,
                               ) -> tuple[dict, dict]:
        """One sharded step's forward and backward (a collective): the values of ``loss`` and
        ``outputs``; the gradients go into the strategy's shard (mean over ranks), so the
        gradients returned are none."""
        self._refuse_hook(hook)
        if wrt or micro_batches != 1:
            raise ValueError("a ZeRO-3 step takes no wrt and one micro-batch")
        self.dematerialize()
        names = list(dict.fromkeys([loss, *(outputs or [])]))
        self.strategy.timeline.begin()  # the step's phases: gathers, forwards, backwards
        self._laps = True
        try:
            values, tapes = self._forward(feeds, names, training=True)
            self._backward(tapes, {loss: np.full_like(values[loss],
                                                      1.0 / self.strategy.comm.size)})
        finally:
            self._laps = False
        return values, {}

    def _lap(self, phase: str) -> None:
        if self._laps:
            self.strategy.timeline.lap(phase)

    # -- gathering and freeing a group ----------------------------------------------------

    def _readers(self, g: int) -> list[int]:
        return [s for s, needs in enumerate(self.strategy.needs) if g in needs]

    def prefetch(self, g: int) -> None:
        """Start group ``g``'s allgather into a new buffer (collective, nonblocking): the next
        group's parameters move while this one computes; ``gather`` waits for it."""
        if g in self.live or g in self.pending:
            return
        st = self.strategy
        group = st.groups[g]
        buf = np.empty(group.n, group.dtype)
        buf[group.lo:group.hi] = group.mine(st.param_shard)
        self.pending[g] = (st.comm.iallgatherv(buf, group.counts), buf)
        st.bytes_sent += group.mine(st.param_shard).nbytes if st.comm.size > 1 else 0

    def gather(self, g: int) -> np.ndarray:
        """Group ``g``'s parameters all-gathered into a new buffer (or the prefetched one),
        which the groups that read them point at (collective)."""
        st = self.strategy
        group = st.groups[g]
        self.prefetch(g)
        request, buf = self.pending.pop(g)
        st.comm.waitall([request])
        views = FlatBuffer(group.shapes, group.dtype, buffer=buf).views
        for s in self._readers(g):
            inits = self.stage_graphs[s].initializers
            for name, view in views.items():
                if name in inits:
                    inits[name] = view
        self.live[g] = buf
        return buf

    def free(self, g: int, tapes: dict[int, list]) -> None:
        """Group ``g``'s gathered parameters dropped: placeholders in the graphs, and any view
        of them a saved context holds stashed until the next gather."""
        buf = self.live.pop(g)
        group = self.strategy.groups[g]
        for s in self._readers(g):
            inits = self.stage_graphs[s].initializers
            for name, shape in group.shapes.items():
                if name in inits:
                    inits[name] = _placeholder(shape, group.dtype)
            if s in tapes:
                self._stash(tapes[s], g, buf)

    def _ensure(self, stage: int) -> None:
        for g in sorted(self.strategy.needs[stage]):
            if g not in self.live:
                self.gather(g)
                self._lap("communicate")

    @staticmethod
    def _swap(ctx: Any, swap: Any) -> None:
        for key, value in list(vars(ctx).items()):
            if isinstance(value, (tuple, list)):
                setattr(ctx, key, type(value)(swap(v) for v in value))
            else:
                setattr(ctx, key, swap(value))

    def _stash(self, tape: list, g: int, buf: np.ndarray) -> None:
        start = buf.__array_interface__["data"][0]

        def swap(v: Any) -> Any:
            if isinstance(v, np.ndarray) and _base_of(v) is buf:
                return _Stashed(g, v.__array_interface__["data"][0] - start, v)
            return v

        for _, ctx in tape:
            self._swap(ctx, swap)

    def _restore(self, tape: list) -> None:
        def swap(v: Any) -> Any:
            if isinstance(v, _Stashed):
                return np.ndarray(v.shape, v.dtype, buffer=self.live[v.group], offset=v.offset,
                                  strides=v.strides)
            return v

        for _, ctx in tape:
            self._swap(ctx, swap)

    # -- the groups in turn -------------------------------------------------------------------

    def _forward(self, feeds: dict, names: list[str], training: bool
                 ) -> tuple[dict, dict[int, list]]:
        stages = self.partition.stages
        unknown = [n for n in names if n not in self.partition.outputs]
        if unknown:
            raise ValueError(f"ZeRO-3: {unknown} are not outputs of graph {self.graph.name!r}; "
                             f"it returns its graph outputs {self.partition.outputs}")
        tapes: dict[int, list] = {}
        out: dict = {}
        last = len(stages) - 1
        for s, stage in enumerate(stages):
            if not self.materialized:
                self._ensure(s)
                if s < last:  # the next group's parameters move while this one computes
                    for g in sorted(self.strategy.needs[s + 1]):
                        self.prefetch(g)
            given = {t: out[t] for t in stage.receives}
            given.update({t: feeds[t] for t in stage.feeds if t in feeds})
            wanted = names if s == last else stage.sends
            grads_for = None
            if training:
                grads_for = set(self.stage_graphs[s].parameters) | {
                    t for t in stage.receives if np.issubdtype(np.asarray(given[t]).dtype,
                                                               np.floating)}
            out, tape = self.executors[s]._forward(given, wanted, grads_for)
            self._lap("forward")
            if training:
                tapes[s] = tape
            del tape
            if not self.materialized:
                keep = self.strategy.needs[s + 1] if s < last else (
                    self.strategy.needs[last] if training else set())
                for g in [g for g in self.live if g not in keep]:
                    self.free(g, tapes)
        return {t: out[t] for t in names}, tapes

    def _backward(self, tapes: dict[int, list], seeds: dict) -> None:
        st = self.strategy
        stages = self.partition.stages
        grads: dict[int, FlatBuffer] = {}
        requests: list[tuple[Any, int]] = []
        for s in range(len(stages) - 1, -1, -1):
            self._ensure(s)
            if s > 0:  # the group before moves while this one's backward runs
                for g in sorted(st.needs[s - 1]):
                    self.prefetch(g)
            tape = tapes.pop(s)
            self._restore(tape)
            stage = stages[s]
            params = set(self.stage_graphs[s].parameters)
            got = self.executors[s]._run_tape(tape, seeds, params | set(stage.receives))
            self._lap("backward")
            del tape
            for name in params:
                if name in got:
                    g = st.home[name]
                    if g not in grads:  # allocated when first written, dropped once sent
                        grads[g] = FlatBuffer(st.groups[g].shapes, st.groups[g].dtype)
                    grads[g].views[name] += got[name]
            seeds = {t: got[t] for t in stage.receives if t in got}
            del got
            for g in sorted(st.needs[s]):
                if st.earliest[g] == s:  # every reader has added to its gradients
                    group = st.groups[g]
                    if g not in grads:  # a group the loss does not reach: zero gradients
                        grads[g] = FlatBuffer(group.shapes, group.dtype)
                    requests.append((st.comm.ireduce_scatter(
                        grads[g].buffer, group.mine(st.grad_shard), group.counts), g))
                    st.bytes_sent += grads[g].nbytes if st.comm.size > 1 else 0
            still = []
            for request, g in requests:  # a sent group's gradients go as soon as MPI is done
                if st.comm.test(request):
                    del grads[g]
                else:
                    still.append((request, g))
            requests = still
            keep = st.needs[s - 1] if s > 0 else set()
            for g in [g for g in self.live if g not in keep]:
                self.free(g, tapes)
        st.comm.waitall([r for r, _ in requests])
        self._lap("communicate")

    def materialize(self) -> None:
        """Every group gathered and kept, and the whole graph pointed at it (evaluation,
        checkpoints, export; a collective)."""
        if self.materialized:
            return
        for g in range(len(self.strategy.groups)):
            if g not in self.live:
                self.gather(g)
        for g, buf in self.live.items():
            views = FlatBuffer(self.strategy.groups[g].shapes, buf.dtype, buffer=buf).views
            for name, view in views.items():
                self.graph.initializers[name] = view
        self.graph.touch()
        self.materialized = True

    def dematerialize(self) -> None:
        """The gathered model dropped again (the next training step); what was written into
        it meanwhile (a restored checkpoint's parameters) is taken into the shards first."""
        if not self.materialized:
            return
        self.strategy.take_graph_values()
        self.live.clear()
        home = self.strategy.home
        for graph in [self.graph, *self.stage_graphs]:
            inits = graph.initializers
            for name in [n for n in inits if n in home]:
                inits[name] = _placeholder(inits[name].shape, inits[name].dtype)
        self.materialized = False


class Zero3(Strategy):
    """ZeRO-3 / fully sharded: each rank keeps 1/P of every layer group's parameters,
    gradients and optimizer state; groups are all-gathered just before their forward and
    backward and freed after (module docstring)."""

    name = "zero3"
    needs_workload: ClassVar[bool] = True
    options = {**Strategy.options,
               "groups": Option(0, "layer groups the graph is cut into, gathered one at a "
                                "time (0: one per 2 M parameters, at least 2)", low=0)}
    pretraining = "average"

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        super().check(optimizer, comm, workload)
        require_shardable(cls.name, optimizer)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    groups: int = 0, **options: Any) -> Zero3:
        workload = required(workload, cls.name)
        cls.check(optimizer, comm, workload)
        return cls(optimizer, comm, workload.graph, workload.executor_maker(), groups,
                   **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None, graph: Any,
                 make: Any, groups: int = 0, **options: Any) -> None:
        super().__init__(optimizer, comm, **options)  # every rank starts from rank 0's values
        params = self.flat_params.views
        total = len(self.flat_params)
        count = groups or max(2, min(len(graph.nodes), total // 2_000_000 + 1))
        part = partition(graph, min(count, len(graph.nodes)), balance="params", tied=True)
        self.home: dict[str, int] = {}
        """Parameter -> the group that holds it (the first that reads it)."""
        for s, stage in enumerate(part.stages):
            for name in stage.initializers:
                if name in params and name not in self.home:
                    self.home[name] = s
        missing = [n for n in params if n not in self.home]
        if missing:
            raise ComponentError(f"distributed 'zero3': parameters {missing} are read by no "
                                 f"node of graph {graph.name!r}")
        self.needs = [{self.home[n] for n in stage.initializers if n in self.home}
                      for stage in part.stages]
        """Per layer group: the groups whose parameters it reads (its own, a tied one)."""
        self.earliest = {g: min(s for s, needs in enumerate(self.needs) if g in needs)
                         for g in range(len(part.stages))}
        """Group -> the first group that reads its parameters: its gradients are final when
        the backward is past it."""
        dtype, p, rank, offset = self.flat_params.dtype, self.comm.size, self.comm.rank, 0
        self.groups: list[Group] = []
        """The layer groups' layouts and this rank's shards of them."""
        for g in range(len(part.stages)):
            shapes = {n: params[n].shape for n in params if self.home[n] == g}
            group = Group(g, shapes, dtype, p, rank, offset)
            offset += group.hi - group.lo
            self.groups.append(group)
        self.param_shard = np.empty(offset, dtype)
        """This rank's shard of every group's parameters, group after group."""
        self.grad_shard = np.zeros(offset, dtype)
        """This rank's shard of every group's mean gradient."""
        for group in self.groups:
            flat = FlatBuffer(group.shapes, dtype)
            flat.pack({n: params[n] for n in group.shapes})
            group.mine(self.param_shard)[...] = flat.buffer[group.lo:group.hi]
        named_state = optimizer.state
        self.shard = Optimizer(optimizer.transform, {FLAT: self.param_shard})
        """The run's optimizer over this rank's shard, as one flat parameter."""
        self.shard.state = self._shard_of(named_state)
        optimizer.state = None
        self.executor = ShardedExecutor(self, graph, part, make)
        """The executor the trainer runs: the groups in turn, gathered and freed."""
        self.trainer_executor = self.executor
        """The trainer runs the sharded executor."""
        # The graph keeps the whole model until the first training step (a checkpoint may be
        # restored into it first); the strategy's own buffers are untouched zeros.
        self.flat_params = FlatBuffer(self.flat_params.shapes, dtype)  # untouched zeros
        self.flat_grads = FlatBuffer(self.flat_params.shapes, dtype)
        self.param_chunks, self.grad_chunks = [], []
        self.steps = 0
        """Steps taken: the gathered state is stale when taken after fewer."""
        self._gathered: Any = None
        self._gathered_at = -1

    # -- the step -------------------------------------------------------------------------

    def step_with(self, executor: Any, feeds: dict, loss: str = "loss",
                  outputs: list[str] | None = None) -> dict:
        """The groups' forward and backward (gathering each, reduce-scattering its gradients),
        then this rank's shard stepped."""
        values, _ = self.executor.inference_and_backprop(feeds, loss=loss, outputs=outputs)
        with summed_over(self.sum_over_ranks):  # a global-norm clip's norm: the whole model's
            self.shard.step({FLAT: self.grad_shard})
        self.steps += 1
        self.timeline.lap("update")
        return values

    def step(self, grads: Params) -> None:
        """Step with this rank's whole gradients (a caller that ran the backward itself):
        reduce-scattered group by group, the mean stepped on this rank's shard."""
        self.executor.dematerialize()
        self.timeline.begin()
        requests = []
        for group in self.groups:
            flat = FlatBuffer(group.shapes, group.dtype)
            flat.pack({n: grads[n] for n in group.shapes})
            requests.append((self.comm.ireduce_scatter(flat.buffer, group.mine(self.grad_shard),
                                                       group.counts), flat))
        self.comm.waitall([r for r, _ in requests])
        self.grad_shard *= 1.0 / self.comm.size
        self.timeline.lap("communicate")
        with summed_over(self.sum_over_ranks):  # a global-norm clip's norm: the whole model's
            self.shard.step({FLAT: self.grad_shard})
        self.steps += 1
        self.timeline.lap("update")

    def sum_over_ranks(self, partial: float) -> float:
        """``partial`` summed over the ranks (a collective; ``global_sum`` while a shard
        steps)."""
        if self.comm.size == 1:
            return partial
        total = np.array([partial], np.float64)
        self.comm.waitall([self.comm.iallreduce(total)])
        return float(total[0])

    @property
    def params(self) -> Params:
        """The parameters: whole only while gathered (``sync_state``, ``finish``)."""
        return self.optimizer.params

    # -- the optimizer state, sharded and whole -----------------------------------------------

    def _shard_of(self, named: Any) -> Any:
        names = {n for g in self.groups for n in g.shapes}

        def cut(values: dict) -> dict:
            out = np.empty(len(self.param_shard), self.param_shard.dtype)
            for group in self.groups:
                flat = FlatBuffer(group.shapes, group.dtype)
                flat.pack({n: values[n] for n in group.shapes})
                group.mine(out)[...] = flat.buffer[group.lo:group.hi]
            return {FLAT: out}

        return _walk(named, cut, lambda tree: bool(tree) and set(tree) == names)

    def _gather_state(self) -> Any:
        def whole(values: dict) -> dict:
            named = {}
            for group in self.groups:
                flat = FlatBuffer(group.shapes, group.dtype)
                flat.buffer[group.lo:group.hi] = group.mine(values[FLAT])
                self.comm.waitall([self.comm.iallgatherv(flat.buffer, group.counts)])
                named.update({n: v.copy() for n, v in flat.views.items()})
            return {n: named[n] for n in self.flat_params.shapes}

        return _walk(self.shard.state, whole, lambda tree: set(tree) == {FLAT})

    def _refresh_state(self) -> None:
        if self._gathered_at != self.steps:
            gathered = self._gather_state()
            self._gathered = gathered if self.comm.is_root else None
            self.optimizer.state = self._gathered
            self._gathered_at = self.steps

    @property
    def state(self) -> Any:
        """The whole optimizer state per parameter name on rank 0, as of the last gather."""
        return self._gathered

    def state_dict(self) -> dict:
        """As ZeRO-2's: the state gathered at the last evaluation or ``finish``, on rank 0."""
        return gathered_state_dict(self)

    def load_state_dict(self, saved: dict) -> None:
        """A whole state (any rank count saved it): this rank keeps its shard. The parameters
        a checkpoint restores into the graph are taken into the shards at the next step."""
        self.shard.state = self._shard_of(saved["state"])
        self._gathered = saved["state"] if self.comm.is_root else None
        self._gathered_at = self.steps

    def take_graph_values(self) -> None:
        """Where the graph holds real values (a restored checkpoint wrote them in place into
        the gathered model), this rank's shard takes its part of them."""
        if not self.executor.materialized:
            return
        for group in self.groups:
            flat = FlatBuffer(group.shapes, group.dtype)
            flat.pack({n: self.executor.graph.initializers[n] for n in group.shapes})
            group.mine(self.param_shard)[...] = flat.buffer[group.lo:group.hi]

    def sync_state(self, state: Any) -> None:
        """Before every evaluation (every rank): the model gathered whole into the graph, the
        running statistics averaged, the optimizer state gathered for a checkpoint."""
        self.executor.materialize()
        super().sync_state(state)
        self._refresh_state()

    def finish(self) -> None:
        """The whole model in the graph and the state gathered (collective)."""
        self.executor.materialize()
        self._refresh_state()

    def predict_comm_s(self, link: Link) -> float:
        # two allgathers (forward, backward) and a reduce-scatter: 1.5 ring allreduces
        return 1.5 * ring_allreduce(link, self.comm.size, self.flat_params.nbytes)
