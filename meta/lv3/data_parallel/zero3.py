"""ZeRO stage 3 (fully sharded data parallelism) over MPI: parameters sharded by layer groups.

Rajbhandari et al.'s ZeRO-3, PyTorch's FSDP: every rank holds 1/P of each layer group's flat
parameters, of their optimizer state and of their gradients, and nothing else of the model
between steps but its slots (below). The graph is cut into consecutive layer groups (the
pipeline's ``partition``, balanced by parameter count); a step runs them in turn on every rank
(each its own batch), each group's executor run as a stage (``Executor.forward_saving`` /
``backward_seeded``): on the planned executor every group is a compiled plan.

* forward: before a group runs, its parameters are all-gathered (``iallgatherv``) into its
  slot, the next group's allgather started as it runs (``prefetch``); after it, the slot is
  free for another group;
* backward, last group first: the group's parameters gathered again into the same slot (its
  saved forward reads them there), its backward run from the gradients the next group handed
  back, its gradients (written by its plan straight into its gradient slot: ``StageHook``)
  reduce-scattered (nonblocking) into this rank's gradient shard;
* the update: the run's elementwise Level 2 optimizer steps this rank's shard of every group
  (one flat parameter), and that is all: the next forward gathers the new values.

Slots: a plan binds the addresses of its graph's parameter arrays when it is compiled, so a
group gathered into a new buffer each time would compile again at every step. Each group is
gathered into the same persistent buffer every time instead, one of a few slots shared by the
groups that are never live together (``slot_colors``: a chain of groups alternates two, a head
tied to the embedding adds a third), each as large as its largest group, and its gradients go
to the same buffers' twins. The whole model is never resident; the slots, about 2 x 2 groups
of float32 (``ShardedExecutor.slot_bytes``: with the default groups of 2 M parameters 32 MB,
next to 4 bytes a parameter of shards at P = 4 with Adam), keep their addresses for good but
hold memory only while in use: each is an anonymous mapping (``Pages``) whose pages go back to
the kernel when its group is freed (the gradient slots once the step's reduce-scatters are
done), to come back zero-filled at the next gather into it.

With the run's ``recompute`` (any spec: ZeRO-3's segments are its layer groups) a training
forward keeps only each group's inputs; every group but the last runs its forward again
(gathered for its backward anyway) just before its backward, and the planned groups share one
arena: one group's activations at a time, not every group's. The groups' executors are made
with every other option of the run's executor (``Workload.executor_maker``: bf16 stays bf16).

A parameter read by two groups (a language model's head tied to its token embedding) lives in
the first group that reads it; the other gathers that group too, and both add to its gradient.
Before an evaluation (``sync_state``) and at ``finish`` the whole model is gathered into
buffers of its own that the graph reads (evaluation copies each group from them into its slot,
so nothing compiles again; export and the checkpoint read the graph), and the optimizer state
is gathered on rank 0 per parameter name: a checkpoint resumes at any rank count, or in one
process.
"""

from __future__ import annotations

import mmap
from typing import Any, ClassVar, Iterable, Sequence

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv1.executor import Executor, SavedForward
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.plan.memory import Arena
from meta.lv1.plan.precision import say_once
from meta.lv1.plan.recompute import RANDOM
from meta.lv2.optimizers import Optimizer, Params, summed_over
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, ring_allreduce
from meta.lv3.data_parallel.shards import FLAT, _walk, gathered_state_dict, require_shardable
from meta.lv3.flat import FlatBuffer, shard_bounds
from meta.lv1.partition import Partition, partition
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload, required


def _placeholder(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` that takes no memory (zeros, read-only): a parameter's place in a
    graph while its values are sharded away."""
    return np.broadcast_to(np.zeros((), dtype), shape)


def _base_of(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


class Pages:
    """A buffer whose address stays while its memory can be given back: an anonymous mapping
    viewed by numpy. A plan compiled against ``array`` stays bound to it; ``release`` hands
    the kernel its pages (``MADV_DONTNEED``), which come back zero-filled when next written,
    so a slot's memory is held only while a group is gathered into it."""

    def __init__(self, n: int, dtype: np.dtype) -> None:
        dtype = np.dtype(dtype)
        self.map = mmap.mmap(-1, max(n * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE)
        """The anonymous private mapping (a shared one keeps its pages: shmem; at least one
        byte: mmap takes no empty one)."""
        self.array = np.frombuffer(self.map, dtype, count=n)
        """Its ``n`` values (the slot)."""

    def release(self) -> None:
        """The pages given back: the values read as zeros until written again."""
        self.map.madvise(mmap.MADV_DONTNEED)


def slot_colors(needs: Sequence[set[int]], count: int) -> list[int]:
    """Each of ``count`` groups' slot: the lowest one that no group live at the same time
    holds. Live together are the groups one stage reads and those the next (or, in the
    backward, the previous) reads, whose gather is started while it runs: a chain of groups
    alternates two slots; a head tied to the embedding puts the embedding's group in a third.
    A group always uses its slot, so the executors bound to its arrays never see them move."""
    conflicts: list[set[int]] = [set() for _ in range(count)]
    for s, reads in enumerate(needs):
        window = reads | (needs[s + 1] if s + 1 < len(needs) else set())
        for g in window:
            conflicts[g] |= window - {g}
    colors: list[int] = []
    for g in range(count):
        taken = {colors[h] for h in conflicts[g] if h < g}
        colors.append(next(c for c in range(count) if c not in taken))
    return colors


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


class StageHook:
    """A planned group's gradient hook (``meta.lv1.gradient_hook``): its plan writes the
    gradients of its own group's parameters straight into that group's gradient slot (so no
    plan owns gradient arrays of its own, which would keep the whole model's gradients on
    every rank), and those of another group's parameters that it reads (a head tied to the
    embedding) into arrays of this hook, which the step adds to that group's gradients. One
    bucket: the group's reduce-scatter starts once its backward is done."""

    bucket_bytes = 1 << 62
    """More than any group: one bucket, the whole backward."""
    seed = 1.0
    """Unused by a stage (its seeds are the step's, already 1/P)."""

    def __init__(self, own: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                 dtype: np.dtype) -> None:
        self.own = own
        """The group's parameter -> its view of the group's gradient slot."""
        self.shapes = shapes
        """Every parameter the group's graph reads -> its shape."""
        self.dtype = dtype
        """The parameters' dtype."""
        self.other: dict[str, np.ndarray] = {}
        """Another group's parameter -> the array this group's plans write its gradient to."""

    def layout(self, names: list[str]) -> dict[str, np.ndarray]:
        for name in names:
            if name not in self.own and name not in self.other:
                self.other[name] = np.empty(self.shapes[name], self.dtype)
        return {n: self.own[n] if n in self.own else self.other[n] for n in names}

    def use(self, names: list[str]) -> None:
        """Nothing to switch: every plan of the group writes into the same arrays."""

    def ready(self, names: list[str]) -> None:
        """Nothing to start early: the step reduce-scatters the group after its backward."""


class Recompute:
    """What a step keeps of a group's forward under ``recompute``: its inputs and the outputs
    asked, to run it again just before its backward."""

    def __init__(self, given: dict, wanted: list[str]) -> None:
        self.given = given
        """The group's inputs (feeds and the groups before's outputs)."""
        self.wanted = wanted
        """The outputs its forward was asked for."""


class ShardedExecutor(Executor):
    """The trainer's executor under ZeRO-3: the graph's layer groups run in turn, each with
    its parameters all-gathered just before (into its slot) and released just after (see the
    module). Every call is a collective over the strategy's ranks, except inference while the
    model is gathered whole (``materialize``: evaluations)."""

    def __init__(self, strategy: Zero3, graph: Any, part: Partition, make: Any,
                 recompute: bool = False) -> None:
        self.strategy = strategy
        """The ZeRO-3 strategy whose shards the groups gather from and reduce into."""
        self.graph = graph
        """The whole graph (its parameters hold values only while ``materialize``d)."""
        self.partition = part
        """The layer groups: stages of the graph, run one after another on every rank."""
        self.stage_graphs = [part.stage_graph(graph, s) for s in range(len(part.stages))]
        """Each group's nodes as a graph of their own (initializers shared with ``graph``
        until the first step, then its parameters' views of their groups' slots)."""
        self.executors = [make(g) for g in self.stage_graphs]
        """Each group's executor, of the run's kind, run as a stage (``forward_saving``,
        ``backward_seeded``): on the planned executor each group is a compiled plan."""
        self.ops = {k: op for ex in self.executors for k, op in ex.ops.items()}
        """Every group's operators (their random state goes into checkpoints)."""
        self.recompute = recompute
        """Whether a training step recomputes each group's forward in its backward (the run's
        ``recompute``): the forward keeps only each group's inputs, and every group but the
        last runs its forward again (gathered for its backward anyway) just before its
        backward. Planned groups then share one arena (``memory.Arena``): no group's
        activations need survive another group's forward."""
        if recompute:
            arena = Arena()
            for ex in self.executors:
                if hasattr(ex, "arena"):
                    ex.arena = arena
        groups = strategy.groups
        self.colors = list(range(len(groups))) if strategy.whole else \
            slot_colors(strategy.needs, len(groups))
        """Group -> its parameter slot (``slot_colors``); its gradient slot: its parity (the
        backward visits the groups one after another, each slot reused two groups later).
        Whole (``Zero2Grouped``): every group a slot of its own."""
        self.hooked = [ex.supports_gradient_hook for ex in self.executors]
        """Per group: whether its executor writes a stage's gradients where a hook says (the
        planned executor's ``forward_saving(..., hook=)``); otherwise they are copied into
        the gradient slot from the executor's own arrays."""
        self.persistent = all(ex.supports_gradient_hook for ex in self.executors)
        """Whether the slots are kept between steps: the groups' executors bind the arrays
        they read and write (planned: compiled plans), so they must never move. Otherwise
        (reference executors) they are allocated for a step and freed after it."""
        self.param_slots: list[np.ndarray] = []
        """The buffers groups are gathered into (each as large as its largest group)."""
        self.grad_slots: list[np.ndarray] = []
        """The buffers groups' gradients are written to and reduce-scattered from."""
        self.param_views: list[dict[str, np.ndarray]] = []
        """Group -> its parameters' views of its slot."""
        self.grad_views: list[dict[str, np.ndarray]] = []
        """Group -> its parameters' gradients' views of its gradient slot."""
        self.hooks: list[StageHook] = []
        """Each group's gradient hook (planned executors: their gradients into the slots)."""
        self.param_pages: list[Pages] = []
        """Where ``persistent`` and not ``whole``: the parameter slots' mappings, whose pages
        go back to the kernel when their group is ``free``d (the slot keeps its address)."""
        self.grad_pages: list[Pages] = []
        """Where ``persistent``: the gradient slots' mappings, whose pages go back to the
        kernel once a step's reduce-scatters are done."""
        self._slot_bases: set[int] = set()
        self.materialized = True
        """Whether ``graph`` holds the whole model (at first, and after ``materialize``)."""
        self.pointed = False
        """Whether the groups' graphs read their slots (``_open``)."""
        self.whole: dict[int, np.ndarray] = {}
        """Group -> its gathered values, while ``materialize``d (what ``graph`` reads)."""
        self.live: dict[int, np.ndarray] = {}
        """Group -> its slot's part holding its gathered parameters, while in use."""
        self.pending: dict[int, Any] = {}
        """Group -> its allgather under way into its slot (``prefetch``)."""
        self._laps = False

    # -- the executor interface --------------------------------------------------------------

    def _mode_changed(self) -> None:
        for ex in self.executors:
            ex.train(bool(self.training))

    def placement(self) -> dict[str, str]:
        return {k: v for ex in self.executors for k, v in ex.placement().items()}

    def slot_bytes(self) -> int:
        """Bytes of the slots (parameters and gradients): what ZeRO-3 holds beyond the shards
        during a step, and between steps where ``persistent``."""
        groups = self.strategy.groups
        params = [0] * (max(self.colors) + 1)
        grads = [0, 0]
        for g, c in enumerate(self.colors):
            params[c] = max(params[c], groups[g].n)
            grads[g % 2] = max(grads[g % 2], groups[g].n)
        return (sum(params) + sum(grads)) * self.strategy.param_shard.dtype.itemsize

    def _open(self) -> None:
        """The slots allocated and the groups' graphs pointed at them (a step's start; once
        for good where ``persistent``)."""
        if self.pointed:
            return
        st = self.strategy
        groups, dtype = st.groups, st.param_shard.dtype
        params = [0] * (max(self.colors) + 1)
        grads = [0, 0]
        for g, c in enumerate(self.colors):
            params[c] = max(params[c], groups[g].n)
            grads[g % 2] = max(grads[g % 2], groups[g].n)
        if self.persistent:  # held for good: their pages given back between uses
            if not st.whole:
                self.param_pages = [Pages(n, dtype) for n in params]
            self.grad_pages = [Pages(n, dtype) for n in grads]
        self.param_slots = [p.array for p in self.param_pages] or \
            [np.empty(n, dtype) for n in params]
        self.grad_slots = [p.array for p in self.grad_pages] or \
            [np.empty(n, dtype) for n in grads]
        self._slot_bases = {id(b) for b in self.param_slots}
        self.param_views = [FlatBuffer(g.shapes, dtype, self.param_slots[c][:g.n]).views
                            for g, c in zip(groups, self.colors)]
        self.grad_views = [FlatBuffer(g.shapes, dtype, self.grad_slots[g.index % 2][:g.n]).views
                           for g in groups]
        self.hooks = [StageHook(self.grad_views[s], {n: self.graph.initializers[n].shape
                                                      for n in sg.parameters}, dtype)
                      for s, sg in enumerate(self.stage_graphs)]
        for graph in self.stage_graphs:
            for name in [n for n in graph.initializers if n in st.home]:
                graph.initializers[name] = self.param_views[st.home[name]][name]
        self.pointed = True

    def _close(self) -> None:
        """The slots freed after a step (not ``persistent``): the groups' graphs read
        placeholders until the next step or ``materialize``."""
        if self.persistent or not self.pointed:
            return
        home = self.strategy.home
        for graph in self.stage_graphs:
            inits = graph.initializers
            for name in [n for n in inits if n in home]:
                inits[name] = _placeholder(inits[name].shape, inits[name].dtype)
        self.param_slots, self.grad_slots, self.param_views, self.grad_views = [], [], [], []
        self.hooks, self._slot_bases = [], set()
        self.live.clear()
        self.pointed = False

    def inference(self, feeds: dict, outputs: Iterable[str] | None = None) -> dict:
        """The graph's ``outputs`` for ``feeds``: from the gathered model where it is whole
        (evaluation), else group by group (a collective)."""
        names = list(outputs) if outputs is not None else list(self.partition.outputs)
        try:
            values, _ = self._forward(feeds, names, training=False)
        finally:
            if not self.materialized:
                self._close()
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
            values, saved = self._forward(feeds, names, training=True)
            self._backward(saved, {loss: np.full_like(values[loss],
                                                      1.0 / self.strategy.comm.size)})
        finally:
            self._laps = False
            self._close()
        return values, {}

    def _lap(self, phase: str) -> None:
        if self._laps:
            self.strategy.timeline.lap(phase)

    # -- gathering a group into its slot ------------------------------------------------------

    def _readers(self, g: int) -> list[int]:
        return [s for s, needs in enumerate(self.strategy.needs) if g in needs]

    def _slot(self, g: int) -> np.ndarray:
        """Group ``g``'s part of its slot, checked free: no other group live or arriving
        there (``slot_colors`` sees to it; a broken schedule fails here, not silently)."""
        c = self.colors[g]
        clash = [h for h in (*self.live, *self.pending) if h != g and self.colors[h] == c]
        if clash:
            raise RuntimeError(f"ZeRO-3: group {g} is gathered into slot {c}, which group "
                               f"{clash[0]} still holds")
        return self.param_slots[c][:self.strategy.groups[g].n]

    def prefetch(self, g: int) -> None:
        """Start group ``g``'s allgather into its slot (collective, nonblocking): the next
        group's parameters move while this one computes; ``gather`` waits for it."""
        if g in self.live or g in self.pending:
            return
        self._open()
        st = self.strategy
        group = st.groups[g]
        buf = self._slot(g)
        buf[group.lo:group.hi] = group.mine(st.param_shard)
        self.pending[g] = st.comm.iallgatherv(buf, group.counts)
        st.bytes_sent += group.mine(st.param_shard).nbytes if st.comm.size > 1 else 0

    def gather(self, g: int) -> np.ndarray:
        """Group ``g``'s parameters all-gathered into its slot (or the prefetch waited for),
        which the groups that read them point at (collective)."""
        self.prefetch(g)
        self.strategy.comm.waitall([self.pending.pop(g)])
        self.live[g] = self.param_slots[self.colors[g]][:self.strategy.groups[g].n]
        self._touch(g)
        return self.live[g]

    def _touch(self, g: int) -> None:
        """The graphs reading group ``g`` have new values in place: an inference plan of
        theirs reorders its weights again (``Graph.touch``)."""
        for s in self._readers(g):
            self.stage_graphs[s].touch()

    def free(self, g: int) -> None:
        """Group ``g``'s slot free for another group (its values stay until overwritten; a
        backward that reads them gathers the group again first; where the slot is ``Pages``
        its memory goes back to the kernel, its values read as zeros). Whole: kept."""
        if not self.strategy.whole:
            self.live.pop(g)
            if self.param_pages:
                self.param_pages[self.colors[g]].release()

    def regather(self) -> None:
        """Every group all-gathered again into its slot after an update (whole: ZeRO-2's
        allgather of the updated parameters; a collective)."""
        self.live.clear()
        if not self.pointed or self.materialized:
            return
        for g in range(len(self.strategy.groups)):
            self.prefetch(g)
        for g in range(len(self.strategy.groups)):
            self.gather(g)

    def _ensure(self, stage: int) -> None:
        for g in sorted(self.strategy.needs[stage]):
            if self.materialized:
                if self.pointed:  # the whole model is here: copied in, nothing moves
                    self._slot(g)[...] = self.whole[g]
                    self._touch(g)
            elif g not in self.live:
                self.gather(g)
                self._lap("communicate")

    def _detached(self, value: Any) -> Any:
        """A value one group hands the next, copied if it is a view of a slot (a weight's
        transpose, on the reference executor), which another group may overwrite."""
        if isinstance(value, np.ndarray) and id(_base_of(value)) in self._slot_bases:
            return value.copy()
        return value

    # -- the groups in turn -------------------------------------------------------------------

    def _forward(self, feeds: dict, names: list[str], training: bool
                 ) -> tuple[dict, dict[int, SavedForward]]:
        stages = self.partition.stages
        unknown = [n for n in names if n not in self.partition.outputs]
        if unknown:
            raise ValueError(f"ZeRO-3: {unknown} are not outputs of graph {self.graph.name!r}; "
                             f"it returns its graph outputs {self.partition.outputs}")
        saved: dict[int, SavedForward] = {}
        out: dict = {}
        last = len(stages) - 1
        for s, stage in enumerate(stages):
            self._ensure(s)
            if not self.materialized and s < last:  # the next group's move while this runs
                for g in sorted(self.strategy.needs[s + 1]):
                    self.prefetch(g)
            given = {t: out[t] for t in stage.receives}
            given.update({t: feeds[t] for t in stage.feeds if t in feeds})
            wanted = names if s == last else stage.sends
            executor = self.executors[s]
            if training:
                out, saved[s] = self._forward_saving(s, given, wanted)
                if self.recompute and s < last:  # its backward runs this forward again
                    saved[s] = Recompute(given, wanted)
            else:
                out = executor.inference(given, wanted)
            out = {t: self._detached(v) for t, v in out.items()}
            self._lap("forward")
            if not self.materialized:
                keep = self.strategy.needs[s + 1] if s < last else (
                    self.strategy.needs[last] if training else set())
                for g in [g for g in self.live if g not in keep]:
                    self.free(g)
        return {t: out[t] for t in names}, saved

    def _forward_saving(self, s: int, given: dict, wanted: list[str]
                        ) -> tuple[dict, SavedForward]:
        """Group ``s``'s training forward, saving for its backward (its gradients into its
        slot: ``StageHook``, where its executor takes one)."""
        wrt = [t for t in self.partition.stages[s].receives
               if np.issubdtype(np.asarray(given[t]).dtype, np.floating)]
        if self.hooked[s]:
            return self.executors[s].forward_saving(given, wanted, wrt, hook=self.hooks[s])
        return self.executors[s].forward_saving(given, wanted, wrt)

    def _recomputed(self, s: int, kept: Recompute) -> SavedForward:
        """Group ``s``'s forward run again for its backward (``recompute``), the state a
        training forward updates (running statistics) put back: updated once a step."""
        state = [(n, a.copy()) for n, a in self.stage_graphs[s].state.items()]
        _, saved = self._forward_saving(s, kept.given, kept.wanted)
        for name, before in state:
            np.copyto(self.stage_graphs[s].initializers[name], before)
        return saved

    def _backward(self, saved: dict[int, Any], seeds: dict) -> None:
        st = self.strategy
        stages = self.partition.stages
        sending: dict[int, Any] = {}  # gradient slot -> its reduce-scatter under way
        others: dict[int, FlatBuffer] = {}  # group -> what later groups added (a tied head)
        for s in range(len(stages) - 1, -1, -1):
            self._ensure(s)
            if s > 0:  # the group before moves while this one's backward runs
                for g in sorted(st.needs[s - 1]):
                    self.prefetch(g)
            c, group = s % 2, st.groups[s]
            if c in sending:  # the gradient slot's last group has left it
                st.comm.waitall([sending.pop(c)])
            handle = saved.pop(s)
            if isinstance(handle, Recompute):
                handle = self._recomputed(s, handle)
            got = self.executors[s].backward_seeded(handle, seeds)
            del handle
            self._lap("backward")
            own = self.grad_views[s]
            for name in self.stage_graphs[s].parameters:
                g = st.home[name]
                if g == s:
                    if got[name] is not own[name]:  # not written there by the plan
                        np.copyto(own[name], got[name])
                else:
                    if g not in others:
                        others[g] = FlatBuffer(st.groups[g].shapes, st.groups[g].dtype)
                    others[g].views[name] += got[name]
            seeds = {t: got[t] for t in stages[s].receives if t in got}
            del got
            buf = self.grad_slots[c][:group.n]
            if s in others:  # every reader has added to its gradients
                buf += others.pop(s).buffer
            sending[c] = st.comm.ireduce_scatter(buf, group.mine(st.grad_shard), group.counts)
            st.bytes_sent += buf.nbytes if st.comm.size > 1 else 0
            keep = st.needs[s - 1] if s > 0 else set()
            for g in [g for g in self.live if g not in keep]:
                self.free(g)
        st.comm.waitall(list(sending.values()))
        for pages in self.grad_pages:  # reduce-scattered: nothing reads them before the next
            pages.release()
        self._lap("communicate")

    def materialize(self) -> None:
        """Every group gathered into a buffer of its own and the whole graph pointed at them
        (evaluation, checkpoints, export; a collective)."""
        if self.materialized:
            return
        st = self.strategy
        for g, group in enumerate(st.groups):
            buf = np.empty(group.n, group.dtype)
            buf[group.lo:group.hi] = group.mine(st.param_shard)
            st.comm.waitall([st.comm.iallgatherv(buf, group.counts)])
            self.whole[g] = buf
            for name, view in FlatBuffer(group.shapes, buf.dtype, buffer=buf).views.items():
                self.graph.initializers[name] = view
                if not self.pointed:  # no slots (reference executors): read it in place
                    for s in self._readers(g):
                        self.stage_graphs[s].initializers[name] = view
        self.graph.touch()
        self.materialized = True

    def dematerialize(self) -> None:
        """The gathered model dropped again (the next training step); what was written into
        it meanwhile (a restored checkpoint's parameters) is taken into the shards first, and
        the groups' graphs are pointed at their slots (``_open``)."""
        if not self.materialized:
            return
        self.strategy.take_graph_values()
        self.whole.clear()
        self.live.clear()  # whole: gathered again from the shards (a restored checkpoint)
        home = self.strategy.home
        inits = self.graph.initializers
        for name in [n for n in inits if n in home]:
            inits[name] = _placeholder(inits[name].shape, inits[name].dtype)
        self._open()
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
    whole = False
    """Whether every rank keeps the whole parameters between steps (``Zero2Grouped``)."""

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        super().check(optimizer, comm, workload)
        require_shardable(cls.name, optimizer)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    groups: int = 0, **options: Any) -> Zero3:
        workload = required(workload, cls.name)
        cls.check(optimizer, comm, workload)
        return cls(optimizer, comm, workload.graph,
                   workload.executor_maker(cls.name, recomputes=True), groups,
                   recompute=workload.recompute, **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None, graph: Any,
                 make: Any, groups: int = 0, recompute: Any = None, **options: Any) -> None:
        if recompute:
            random = [n for n in graph.nodes if n.op_type in RANDOM]
            if random:
                raise ComponentError(
                    f"distributed 'zero3' with recompute={recompute!r}: node "
                    f"{random[0].name!r} ({random[0].op_type}) draws random numbers, which "
                    f"the recomputed forward would draw differently; drop recompute")
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
        self.executor = ShardedExecutor(self, graph, part, make, bool(recompute))
        """The executor the trainer runs: the groups in turn, gathered and freed."""
        if recompute:  # its own granularity, whatever the patterns: said once
            say_once(f"meta: zero3 recomputes each of its {len(part.stages)} layer groups "
                     f"(recompute={recompute!r}): a group's activations live only while its "
                     f"backward runs")
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
        with summed_over(self.comm.sum_float):  # a global-norm clip's norm: the whole model's
            self.shard.step({FLAT: self.grad_shard})
        self.steps += 1
        self.timeline.lap("update")
        if self.whole:  # the updated parameters to every rank now (ZeRO-2)
            self.executor.regather()
            self.timeline.lap("communicate")
        return values

    def step(self, grads: Params) -> None:
        """Step with this rank's whole gradients (a caller that ran the backward itself):
        reduce-scattered group by group, the mean stepped on this rank's shard."""
        self.executor.dematerialize()
        self.executor._close()  # no group runs here
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
        with summed_over(self.comm.sum_float):  # a global-norm clip's norm: the whole model's
            self.shard.step({FLAT: self.grad_shard})
        self.steps += 1
        self.timeline.lap("update")

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


class Zero2Grouped(Zero3):
    """ZeRO-2 on the planned executor: the parameters whole on every rank (each group in a
    slot of its own, all-gathered after each update), the gradients and the optimizer state
    sharded, run through ZeRO-3's layer groups. A plan binds its gradient arrays, so ZeRO-2's
    one-plan path keeps a flat buffer of the whole model's gradients on every rank; here each
    group's plan writes its gradients into one of two alternating gradient slots, which are
    reduce-scattered into this rank's shard as soon as the group's backward is done: two groups'
    gradients instead of the whole model's (``Zero2.from_recipe`` takes this path where the
    run's executor takes a gradient hook)."""

    name = "zero2"
    whole = True

    def predict_comm_s(self, link: Link) -> float:
        # a reduce-scatter and one allgather (after the update): one ring allreduce, as ZeRO-2
        return ring_allreduce(link, self.comm.size, self.flat_params.nbytes)
