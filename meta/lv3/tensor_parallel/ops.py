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


def register_operators() -> None:
    """Make the two operators known to the executors (once; later calls do nothing), and
    their lowerings to the planned executor's kernel table (``lowering``: in place, the
    backward's allreduces overlapped with the weight gradients)."""
    from meta.lv1.plan.kernels import KERNELS
    from meta.lv3.tensor_parallel.lowering import KERNELS as LOWERINGS

    for cls in (CopyToParallel, AllReduceSum):
        register(cls.__name__, domain=DOMAIN)(cls)
        KERNELS[f"{DOMAIN}::{cls.__name__}"] = LOWERINGS[cls.__name__]
