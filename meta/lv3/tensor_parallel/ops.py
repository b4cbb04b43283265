"""The collectives of a partitioned graph as operators (Megatron-LM's conjugate f and g).

A layer split across ranks is an ordinary node of each rank's local graph; what joins the
ranks are two operators of the domain ``ai.meta.parallel`` that the executor runs and
differentiates like any other, so forward and backward of a partitioned step are the
executor's own (reference or native, tape and all; planned: steps of its plan, in place and
overlapped, ``lowering``). Two are enough, because the planner splits only chains that begin
at a column-parallel and end at a row-parallel layer:

* ``CopyToParallel`` (Megatron's f): the identity forward; backward sums the gradient over
  the ranks. It feeds a replicated tensor into a column-parallel layer, whose ranks each
  contribute a part of that tensor's gradient.
* ``AllReduceSum`` (Megatron's g): sums the partial outputs of a row-parallel layer forward;
  backward is the identity (every rank needs the whole output's gradient).

They are registered by ``register_operators`` when a graph is partitioned, not on import: they
run only inside the job that bound their communicator, so they are not operators of the
library that ``meta ops`` lists and the registry-driven tests walk.

Operators receive only arrays and attributes, so the communicator is named by an integer
``group`` that ``bind`` hands out; the ``Group`` also counts the bytes this rank hands to MPI
and the seconds spent in the collectives.

>>> from meta.lv3.comm.communicator import SingleProcessCommunicator
>>> register_operators()
>>> group = bind(SingleProcessCommunicator())
>>> AllReduceSum(group=group).forward(None, np.ones(3)).tolist(), groups(group).bytes_sent
([1.0, 1.0, 1.0], 24)
>>> release(group)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from meta.common import threads as _threads
from meta.lv0 import Operator, register
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import poll_all
from meta.lv3.tensor_parallel.rows import row_counts, rows

DOMAIN = "ai.meta.parallel"


@dataclass
class Group:
    """A communicator the operators use, with what they did on it."""

    comm: Communicator
    """The communicator of the ranks that split the layers."""
    bytes_sent: int = 0
    """send buffers handed to MPI"""
    seconds: float = 0.0
    """inside the collectives (transfer and waiting for the peers)"""
    calls: int = 0
    """Collectives run."""

    def __post_init__(self) -> None:
        # MPICH's blocking collectives spin: with more ranks than cores they steal the core a
        # peer needs (see Strategy.average), so then the operators poll a nonblocking one
        self.poll = self.comm.size > 1 and _threads.local_ranks() > _threads.cores()

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        """Sum ``buf`` over the ranks, in place."""
        start = time.perf_counter()
        if self.comm.size > 1:
            if self.poll:
                poll_all(self.comm, [self.comm.iallreduce(buf)])
            else:
                self.comm.allreduce(buf)
        self.bytes_sent += buf.nbytes
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return buf

    def _complete(self, request: Any) -> None:
        if self.poll:
            poll_all(self.comm, [request])
        else:
            self.comm.wait(request)

    def reduce_scatter_rows(self, whole: np.ndarray, mine: np.ndarray) -> np.ndarray:
        """``mine`` = this rank's rows (``rows``) of the sum of ``whole`` over the ranks."""
        start = time.perf_counter()
        counts = row_counts(whole, self.comm.size)
        if self.comm.size > 1:
            self._complete(self.comm.ireduce_scatter(whole, mine, counts))
        else:
            np.copyto(mine, whole)
        self.bytes_sent += whole.nbytes
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return mine

    def gathered(self, part: np.ndarray, batch: int) -> np.ndarray:
        """Every rank's rows of a batch of ``batch`` rows (this rank's: ``part``), on every
        rank."""
        whole = np.empty((batch, *np.shape(part)[1:]), np.asarray(part).dtype)
        whole[rows(batch, self.comm.size, self.comm.rank)] = part
        return self.allgather_rows(whole)

    def allgather_rows(self, whole: np.ndarray) -> np.ndarray:
        """Every rank's rows of ``whole`` (each rank's own already in place) on every rank, in
        place."""
        start = time.perf_counter()
        if self.comm.size > 1:
            self._complete(self.comm.iallgatherv(whole, row_counts(whole, self.comm.size)))
        self.bytes_sent += whole.nbytes
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return whole


_GROUPS: dict[int, Group] = {}
_IDS = itertools.count(1)


def bind(comm: Communicator) -> int:
    """Register ``comm`` for the operators; returns the ``group`` attribute that names it."""
    key = next(_IDS)
    _GROUPS[key] = Group(comm)
    return key


def groups(key: int) -> Group:
    group = _GROUPS.get(key)
    if group is None:
        raise LookupError(f"no communicator is bound to group {key}: a partitioned graph runs "
                          "only in the process that partitioned it "
                          "(meta.lv3.tensor_parallel.strategy)")
    return group


def release(key: int) -> None:
    _GROUPS.pop(key, None)


class GroupCollective(Operator):
    """An operator that sums over one registered Group of ranks (the two below)."""

    communicates = True
    """A collective: the planned executor places it as communication, not Python time."""

    attributes = {"group": 0}
    """``group``: which registered Group it communicates on."""

    def communicator(self) -> Group:
        """The Group it sums over (its plan lowering asks here, not the registry)."""
        return groups(self.group)


class CopyToParallel(GroupCollective):
    """y = x; the gradient of x is the sum of every rank's gradient of y."""

    def forward(self, ctx: Any, x: np.ndarray) -> np.ndarray:
        return x

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray]:
        return (self.communicator().allreduce(np.array(dy, copy=True)),)


class AllReduceSum(GroupCollective):
    """y = the sum of x over the ranks; the gradient of x is the gradient of y."""

    def forward(self, ctx: Any, x: np.ndarray) -> np.ndarray:
        return self.communicator().allreduce(np.array(x, copy=True))

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray]:
        return (dy,)


class ScatterRows(GroupCollective):
    """y = this rank's rows of x (axis 0: ``rows``); the gradient of x is every rank's rows
    of it gathered (Megatron-LM's scatter into the sequence-parallel region). The data and a
    whole activation enter the row-split part of the graph (``sequence``) through it."""

    def forward(self, ctx: Any, x: np.ndarray) -> np.ndarray:
        comm = self.communicator().comm
        ctx.save(batch=len(x))
        return np.array(x[rows(len(x), comm.size, comm.rank)], copy=True)

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray]:
        return (self.communicator().gathered(dy, ctx.batch),)


class GatherRows(GroupCollective):
    """y = every rank's rows of x (axis 0) gathered: the whole tensor on every rank; the second
    input is any tensor with the whole batch on its axis 0 (a graph input), which says how
    many rows there are. Backward (``reduce`` 1): the gradient of y summed over the ranks,
    this rank's rows kept (a reduce-scatter: y feeds column-parallel layers, each rank's
    gradient a part; Megatron-LM's all-gather before them in sequence parallelism);
    ``reduce`` 0: this rank's rows of it (y is read alike on every rank: a graph output)."""

    attributes = {"group": 0, "reduce": 1}
    """``group``: which registered Group it gathers on; ``reduce``: 1 (the backward sums
    the ranks' gradients, a reduce-scatter) or 0 (this rank's rows of it)."""
    no_grad_inputs = (1,)
    """The batch-sized input only says how many rows there are: no gradient."""

    def forward(self, ctx: Any, x: np.ndarray, batch: np.ndarray) -> np.ndarray:
        return self.communicator().gathered(x, len(batch))

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray, None]:
        group = self.communicator()
        mine = rows(len(dy), group.comm.size, group.comm.rank)
        if not self.reduce:
            return np.array(dy[mine], copy=True), None
        dx = np.empty((mine.stop - mine.start, *dy.shape[1:]), dy.dtype)
        return group.reduce_scatter_rows(np.ascontiguousarray(dy), dx), None


class ReduceScatterRows(GroupCollective):
    """y = this rank's rows of the sum of x over the ranks (a row-parallel layer's partial
    output: Megatron-LM's reduce-scatter in sequence parallelism, in place of the
    allreduce); the gradient of x is every rank's rows of the gradient of y gathered."""

    def forward(self, ctx: Any, x: np.ndarray) -> np.ndarray:
        group = self.communicator()
        mine = rows(len(x), group.comm.size, group.comm.rank)
        ctx.save(batch=len(x))
        y = np.empty((mine.stop - mine.start, *np.shape(x)[1:]), np.asarray(x).dtype)
        return group.reduce_scatter_rows(np.ascontiguousarray(x), y)

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray]:
        return (self.communicator().gathered(dy, ctx.batch),)


class ShareOfMean(Operator):
    """y = this rank's part of a mean loss over every rank's rows, from its mean over its
    own (x): x times its counted labels over all ranks' (the second input: its rows of the
    labels; the third: the whole labels; labels equal to ``ignore_index`` do not count, as in
    SoftmaxCrossEntropyLoss). The ranks' parts add up to the mean (the strategy sums them
    with the gradients, ``Plan.partial_outputs``: no collective of its own); the gradient of
    x is the gradient of y times the same share."""

    attributes = {"ignore_index": -100}
    """``ignore_index``: the label that does not count, as SoftmaxCrossEntropyLoss's."""
    no_grad_inputs = (1, 2)
    """The labels (this rank's and the whole batch's): no gradient."""

    def forward(self, ctx: Any, x: np.ndarray, mine: np.ndarray, labels: np.ndarray
                ) -> np.ndarray:
        counted = np.count_nonzero(np.asarray(labels) != self.ignore_index)
        share = np.count_nonzero(np.asarray(mine) != self.ignore_index) / counted \
            if counted else 0.0
        ctx.save(share=share)
        return np.asarray(x * share, np.asarray(x).dtype)

    def backward(self, ctx: Any, dy: np.ndarray) -> tuple[np.ndarray, None, None]:
        return np.asarray(dy * ctx.share, np.asarray(dy).dtype), None, None


def register_operators() -> None:
    """Make the two operators known to the executors (once; later calls do nothing), and
    their lowerings to the planned executor's kernel table (``lowering``: in place, the
    backward's allreduces overlapped with the weight gradients)."""
    from meta.lv1.plan.kernels import KERNELS
    from meta.lv3.tensor_parallel.lowering import KERNELS as LOWERINGS

    for cls in (CopyToParallel, AllReduceSum, ScatterRows, GatherRows, ReduceScatterRows,
                ShareOfMean):
        register(cls.__name__, domain=DOMAIN)(cls)
        if cls.__name__ in LOWERINGS:
            KERNELS[f"{DOMAIN}::{cls.__name__}"] = LOWERINGS[cls.__name__]
