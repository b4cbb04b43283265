"""ZeRO stage 2 over MPI: gradients reduce-scattered, each rank steps only its shard.

Rajbhandari et al.'s ZeRO-2: with P ranks each keeps the summed gradient and the optimizer
state of 1/P of the flat parameters ([lo, hi) of ``shard_bounds``), steps that shard with the
run's Level 2 optimizer (its transformation over one flat "parameter"), and the ranks then
all-gather the updated shards, so every rank holds the whole model again for the next forward.
A reduce-scatter and an allgather move what one ring allreduce moves, but the optimizer's
state (Adam: two arrays the size of the model) and its update cost each rank 1/P.

The gradients are exchanged in buckets of ``bucket_bytes`` along the flat buffer, each one
reduce-scattered (nonblocking) as soon as the backward has finished every parameter it
overlaps (the planned executor's gradient hook), as the allreduce strategy overlaps its
allreduces. Where the executor returns the gradients instead (reference, native), each chunk
of them is packed into a buffer of its own and dropped once reduce-scattered: the rank keeps
no whole flat copy of the gradients. A plan binds the gradient arrays it writes, so this
one-plan path keeps ``flat_grads`` whole on the planned executor; a recipe's ``zero2`` there
runs through ZeRO-3's layer groups with the parameters whole instead (``from_recipe``:
``zero3.Zero2Grouped``), holding two groups' gradients. Only an elementwise optimizer (``GradientTransformation.elementwise``: SGD, with
momentum, Adam, RMSProp, Adagrad, weight decay, schedules) can be stepped a shard at a time,
and a global-norm clip (``grad_clip``), whose norm is summed over the ranks
(``meta.lv2.optimizers.summed_over``); another (a rule by parameter name) is refused in one
line.

The optimizer state is gathered whole, per parameter name as the unsharded optimizer lays it
out, at every evaluation (``sync_state``, a collective) and at ``finish``: a checkpoint written
then (each epoch's) resumes at any number of ranks, or in one process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.common.component import Option
from meta.lv1.gradient_hook import GradientHook
from meta.lv1.plan.precision import say_once
from meta.lv2.optimizers import Optimizer, Params, summed_over
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, ring_allreduce
from meta.lv3.data_parallel.shards import FLAT, _walk, gathered_state_dict, require_shardable
from meta.lv3.flat import FlatBuffer, shard_bounds
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload


class Zero2(Strategy):
    """ZeRO-2: gradients reduce-scattered, each rank steps its 1/P of the flat parameters (and
    keeps that shard's optimizer state only), the updated shards all-gathered.

    >>> from meta.lv2.optimizers import sgd
    >>> opt = Zero2(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """

    name = "zero2"
    options = {**Strategy.options,
               "overlap": Option(True, "start each bucket's reduce-scatter as soon as the "
                                 "backward finishes its gradients (executors that take a "
                                 "gradient hook: planned)"),
               "bucket_bytes": Option(1 << 20, "bytes of gradients per reduce-scatter (and "
                                      "per allgather of the updated parameters)", low=1024)}
    pretraining = "average"

    @classmethod
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        super().check(optimizer, comm, workload)
        require_shardable(cls.name, optimizer)

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    **options: Any) -> Strategy:
        """ZeRO-2; on an executor whose plans bind their gradient arrays (planned) through
        ZeRO-3's layer groups with the parameters kept whole (``Zero2Grouped``), so no rank
        keeps the whole model's gradients."""
        cls.check(optimizer, comm, workload)
        if workload is not None and workload.executor.supports_gradient_hook:
            from meta.lv3.data_parallel.zero3 import Zero2Grouped

            overlap = options.pop("overlap", True)  # always: each group's starts at once
            bucket = options.pop("bucket_bytes", cls.options["bucket_bytes"].default)
            if not overlap or bucket != cls.options["bucket_bytes"].default:
                say_once(f"meta: zero2 on the {type(workload.executor).__name__} runs through "
                         f"layer groups, a group a bucket, overlapped: overlap={overlap} and "
                         f"bucket_bytes={bucket} do not apply")
            return Zero2Grouped.from_recipe(optimizer, comm, workload, **options)
        return cls(optimizer, comm, **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 overlap: bool = True, bucket_bytes: int = 1 << 20, **options: Any) -> None:
        super().__init__(optimizer, comm, **options)
        p, n = self.comm.size, len(self.flat_params)
        self.overlap = overlap
        """Whether the reduce-scatters start during the backward (``ZeroBuckets``)."""
        self.bounds = shard_bounds(n, p)
        """[lo, hi) of each rank's shard of the flat parameters."""
        self.lo, self.hi = self.bounds[self.comm.rank]
        """[lo, hi) of this rank's shard of the flat parameters (and gradients, and state)."""
        self.counts = [hi - lo for lo, hi in self.bounds]
        """Each rank's shard size: the counts of a whole buffer's reduce-scatter/allgather."""
        self.grad_shard = np.zeros(self.hi - self.lo, self.flat_params.dtype)
        """This rank's shard of the summed (then mean) gradient: the only gradient it keeps
        past the exchange."""
        step = max(1, int(bucket_bytes) // self.flat_params.dtype.itemsize)
        self.buckets = [(a, min(a + step, n)) for a in range(0, n, step)]
        """[a, b) of each bucket along the flat buffer: one reduce-scatter each, started
        during the backward."""
        chunk = max(1, len(self.param_chunks[0]) if self.param_chunks else n)
        self.chunks = [(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        """[a, b) of each ``chunk_bytes`` chunk: the exchanges that follow the backward (a
        reduce-scatter without the hook, the allgather after the update) go in these, fewer
        and larger (the allreduce's chunks)."""
        self.shard = Optimizer(optimizer.transform,
                               {FLAT: self.flat_params.buffer[self.lo:self.hi]})
        """The run's optimizer over this rank's shard, as one flat parameter."""
        self.shard.state = self._shard_of(optimizer.state)  # a resumed run's state goes on
        optimizer.state = None  # the whole state is no rank's: ``state_dict`` gathers it
        self._gathered: Any = None
        self._gathered_at = -1
        self.steps = 0
        """Steps taken: the gathered state is stale when taken after fewer."""
        self._ends: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, view in self.flat_params.views.items():
            self._ends[name] = (offset, offset + view.size)
            offset += view.size
        self.hook = ZeroBuckets(self, bucket_bytes)
        """The gradient hook the planned executor's backward hands its buckets to."""

    # -- the step ---------------------------------------------------------------------------

    def step(self, grads: Params) -> None:
        """Reduce-scatter ``grads`` (this rank's), step this rank's shard with its mean, and
        all-gather the updated parameters."""
        t = self.timeline
        t.begin()
        self._reduce_scatter_chunks(grads)
        self.bytes_sent += self.flat_grads.nbytes if self.comm.size > 1 else 0
        t.lap("communicate")
        self.grad_shard *= 1.0 / self.comm.size
        t.lap("unpack")
        self._update()

    def _reduce_scatter_chunks(self, grads: Params) -> None:
        """``grads`` reduce-scattered into ``grad_shard`` chunk by chunk, each chunk packed
        into a buffer of its own that goes once its reduce-scatter is done (two under way at
        a time): the rank never holds a whole flat copy of the gradients besides the
        executor's (``flat_grads`` is left untouched, so its zeroed pages take no memory),
        as DeepSpeed's ZeRO-2 keeps only its buckets."""
        self.flat_grads._check(grads, "pack")
        flat = [(np.ravel(grads[n]), lo, hi) for n, (lo, hi) in self._ends.items()]
        flying: list[tuple[Any, np.ndarray]] = []
        for a, b in self.chunks:
            buf = np.empty(b - a, self.flat_grads.dtype)
            for g, lo, hi in flat:
                if lo < b and a < hi:
                    s, e = max(lo, a), min(hi, b)
                    buf[s - a:e - a] = g[s - lo:e - lo]
            flying.append((self._reduce_scatter(a, b, buf), buf))
            if len(flying) > 2:
                self._wait([flying.pop(0)[0]])
        self._wait([r for r, _ in flying])

    def step_with(self, executor: Any, feeds: dict, loss: str = "loss",
                  outputs: list[str] | None = None) -> dict:
        """Forward and a backward that starts each bucket's reduce-scatter as soon as every
        gradient in it is final, then the update of this rank's shard and the allgather.
        Without overlap or an executor that takes the hook: ``step`` after the backward."""
        if not (self.overlap and self.comm.size > 1 and executor.supports_gradient_hook):
            return super().step_with(executor, feeds, loss, outputs)
        h = self.hook
        h.start()
        values, grads = executor.inference_and_backprop(feeds, loss=loss, outputs=outputs,
                                                        hook=h)
        t = self.timeline
        t.begin()  # forward and backward, the overlapped reduce-scatters under way
        if not h.used:  # the executor ran unplanned: no bucket was handed over
            self._reduce_scatter_chunks(grads)
            self.grad_shard *= 1.0 / self.comm.size
        else:
            h.finish()  # the seed was 1/P: the sums are the means
        self.bytes_sent += self.flat_grads.nbytes
        t.lap("communicate")
        self._update()
        return values

    def _reduce_scatter(self, a: int, b: int, source: np.ndarray | None = None) -> Any:
        """Start the reduce-scatter of gradient bucket [a, b) (of ``flat_grads``, or
        ``source`` holding it): each rank receives the sum of the part of it in its
        shard."""
        counts = [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.bounds]
        start = max(a, self.lo) - self.lo
        mine = self.grad_shard[start:start + counts[self.comm.rank]]
        send = self.flat_grads.buffer[a:b] if source is None else source
        return self.comm.ireduce_scatter(send, mine, counts)

    def _wait(self, requests: Any) -> None:
        self.comm.waitall(list(requests))

    def _update(self) -> None:
        """Step this rank's shard, then every rank gathers every shard (in buckets)."""
        t = self.timeline
        with summed_over(self.comm.sum_float):  # a global-norm clip's norm: the whole model's
            self.shard.step({FLAT: self.grad_shard})
        self.steps += 1
        t.lap("update")
        self.gather_params()
        self.bytes_sent += self.grad_shard.nbytes if self.comm.size > 1 else 0
        t.lap("communicate")

    def gather_params(self) -> None:
        """Every rank's shard of the parameters into every rank's flat buffer (collective)."""
        if self.comm.size > 1:
            buffer = self.flat_params.buffer
            requests = []
            for a, b in self.chunks:
                counts = [max(0, min(b, hi) - max(a, lo)) for lo, hi in self.bounds]
                requests.append(self.comm.iallgatherv(buffer[a:b], counts))
            self._wait(requests)
        touch = getattr(self.optimizer.params, "touch", None)
        if touch is not None:  # the graph's version stamp: planned executors re-read weights
            touch()

    # -- the optimizer state, sharded and whole ------------------------------------------------

    def _is_named(self, tree: dict) -> bool:
        return bool(tree) and set(tree) == set(self.flat_params.shapes)

    def _shard_of(self, named: Any) -> Any:
        """A state laid out per parameter name (the unsharded optimizer's) cut to this rank's
        shard, as one flat parameter."""
        def cut(values: dict) -> dict:
            whole = FlatBuffer(self.flat_params.shapes, self.flat_params.dtype)
            whole.pack({name: values[name] for name in self.flat_params.shapes})
            return {FLAT: whole.buffer[self.lo:self.hi].copy()}

        return _walk(named, cut, self._is_named)

    def _gather_state(self) -> Any:
        """The whole state per parameter name: each shard's arrays all-gathered (collective,
        in the same order on every rank)."""
        def whole(values: dict) -> dict:
            flat = FlatBuffer(self.flat_params.shapes, self.flat_params.dtype)
            flat.buffer[self.lo:self.hi] = values[FLAT]
            self._wait([self.comm.iallgatherv(flat.buffer, self.counts)])
            return {name: view.copy() for name, view in flat.views.items()}

        return _walk(self.shard.state, whole, lambda tree: set(tree) == {FLAT})

    def _refresh_state(self) -> None:
        """Gather the whole state where it is stale (collective); rank 0, which writes the
        checkpoints, keeps it (as the wrapped optimizer's ``state``), the others drop it."""
        if self._gathered_at != self.steps:
            gathered = self._gather_state()
            self._gathered = gathered if self.comm.is_root else None
            self.optimizer.state = self._gathered
            self._gathered_at = self.steps

    @property
    def state(self) -> Any:
        """The whole optimizer state per parameter name on rank 0, as of the last gather
        (every evaluation, ``finish``; on one process: now); None on the other ranks."""
        if self.comm.size == 1:
            self._refresh_state()
        return self._gathered

    def state_dict(self) -> dict:
        """The whole state per parameter name (a checkpoint resumes at any rank count), on
        rank 0. Not a collective: it is the state gathered at the last evaluation or
        ``finish``; asked after steps since, it refuses rather than save a stale state."""
        if self.comm.size == 1:
            self._refresh_state()
        return gathered_state_dict(self)

    def load_state_dict(self, saved: dict) -> None:
        """Take a whole state (per parameter name, as any rank count saved it): this rank
        keeps its shard (raises KeyError for a missing name)."""
        self.shard.state = self._shard_of(saved["state"])
        self._gathered = saved["state"] if self.comm.is_root else None
        self._gathered_at = self.steps

    def sync_state(self, state: Any) -> None:
        """Before every evaluation (every rank): the running statistics averaged, as every
        strategy does, and the optimizer's state gathered for the checkpoint that may follow."""
        super().sync_state(state)
        self._refresh_state()

    def finish(self) -> None:
        """The whole optimizer state gathered on every rank (collective): ``state_dict``
        then holds it for a final checkpoint."""
        self._refresh_state()

    def predict_comm_s(self, link: Link) -> float:
        # a reduce-scatter and an allgather move what a ring allreduce (the two of them) moves
        return ring_allreduce(link, self.comm.size, self.flat_params.nbytes)


class ZeroBuckets(GradientHook):
    """ZeRO's side of a backward that hands over gradients as they finish (the planned
    executor's gradient hook). The gradients are written straight into the strategy's flat
    gradient buffer (the parameters' order, whatever the order the backward finishes them
    in); a bucket of that buffer is reduce-scattered once every parameter it overlaps is
    final. The loss's gradient is scaled by 1/P (``seed``), so the sums are the means;
    parameters the backward never reaches get zero gradients."""

    def __init__(self, strategy: Zero2, bucket_bytes: int) -> None:
        self.strategy = strategy
        """The ZeRO strategy whose buffers and shards the gradients go to."""
        self.bucket_bytes = int(bucket_bytes)
        """Bytes of final gradients between two ``ready`` calls (the executor's cuts)."""
        self.seed = 1.0 / strategy.comm.size
        """The loss's gradient is scaled by 1/P: the reduce-scattered sums are the means."""
        flat = strategy.flat_params
        ends, offset = {}, 0
        for name, view in flat.views.items():
            ends[name] = (offset, offset + view.size)
            offset += view.size
        self._of_param = {name: [k for k, (a, b) in enumerate(strategy.buckets)
                                if a < hi and lo < b] for name, (lo, hi) in ends.items()}
        self._needs = [0] * len(strategy.buckets)
        for name, ks in self._of_param.items():
            for k in ks:
                self._needs[k] += 1
        self._unreached: list[str] = []
        self._requests: list[tuple[Any, int]] = []
        self._left: list[int] = []
        self._started: list[bool] = []
        self.used = False
        """Whether this step's backward handed over any bucket (an unplanned executor does
        not: the exchange then follows the backward)."""

    def layout(self, names: list[str]) -> dict[str, np.ndarray]:
        """The strategy's gradient buffer, one view per parameter (a fixed layout: every plan
        gets the same arrays)."""
        self.use(names)
        return self.strategy.flat_grads.views

    def use(self, names: list[str]) -> None:
        reached = set(names)
        self._unreached = [n for n in self.strategy.flat_params.shapes if n not in reached]

    def start(self) -> None:
        self._requests, self.used = [], False
        self._left = list(self._needs)
        self._started = [False] * len(self._needs)

    def ready(self, names: list[str]) -> None:
        if not self.used:  # the first bucket of this backward: the plan's layout is known
            self.used = True
            views = self.strategy.flat_grads.views
            for name in self._unreached:
                views[name][...] = 0
            self._done(self._unreached)
        self._done(names)
        self._progress()

    def _done(self, names: list[str]) -> None:
        for name in names:
            for k in self._of_param[name]:
                self._left[k] -= 1
                if self._left[k] == 0 and not self._started[k]:
                    self._started[k] = True
                    a, b = self.strategy.buckets[k]
                    self._requests.append((self.strategy._reduce_scatter(a, b),
                                          self.strategy.timeline.now()))

    def _progress(self) -> None:
        still = []
        for request, began in self._requests:
            if self.strategy.comm.test(request):
                self.strategy.timeline.background("reduce-scatter (overlapped)", began)
            else:
                still.append((request, began))
        self._requests = still

    def finish(self) -> None:
        for k, started in enumerate(self._started):  # buckets of parameters never reached
            if not started:
                self._started[k] = True
                a, b = self.strategy.buckets[k]
                self._requests.append((self.strategy._reduce_scatter(a, b),
                                      self.strategy.timeline.now()))
        for request, began in self._requests:
            self.strategy.comm.waitall([request])
            self.strategy.timeline.background("reduce-scatter (overlapped)", began)
        self._requests = []
