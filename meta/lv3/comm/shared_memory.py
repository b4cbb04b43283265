"""Memory the ranks of one machine share: MPI-3 shared windows mapped as numpy arrays.

``MPI_Win_allocate_shared`` on the node's communicator (``Split_type(COMM_TYPE_SHARED)``) gives
every rank a segment of one shared allocation, and ``Win_shared_query`` the address of any
rank's segment: a rank then reads and writes the others' memory with plain loads and stores,
no message and no copy through MPI's own buffers. Writes become visible to the others at a
``fence`` (``Win_sync``, a barrier, ``Win_sync``: MPI's "separate memory model" rule for
shared windows). Hogwild keeps its parameters here; the allreduce strategy sums gradients
straight out of the other ranks' segments (``NodeExchange``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from meta.lv3.comm.communicator import Communicator, MPICommunicator


def node_of(comm: Communicator) -> MPICommunicator | None:
    """The ranks of ``comm`` on this rank's machine (ordered as in ``comm``), or None where
    memory cannot be shared (one process, or a communicator that is not MPI's)."""
    if comm.size == 1 or not isinstance(comm, MPICommunicator):
        return None
    MPI = comm._MPI  # noqa: N806 - the module's conventional name
    return MPICommunicator(comm.comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank))


class SharedSegments:
    """One shared window over ``node`` (collective): ``count`` values of ``dtype`` in this
    rank's segment, and ``segments[q]``, rank q's segment as an array here.

    ``polling``: wait in ``fence`` on a nonblocking barrier, yielding the core between tests
    (more ranks than cores: MPICH's blocking barrier spins on the core a peer needs; sleeping
    instead, as ``polling.poll_barrier`` does, cost LeNet-5 at 4 ranks on 2 cores 0.68 of
    independent runs' speed, yielding 0.90: ``benchmarks/data_parallel.py``)."""

    def __init__(self, node: MPICommunicator, count: int, dtype: Any,
                 polling: bool = False) -> None:
        MPI = node._MPI  # noqa: N806
        self.node, self.dtype, self.polling = node, np.dtype(dtype), polling
        """``node``: the node's ranks. ``dtype``: the values'. ``polling``: whether ``fence``
        yields the core while it waits."""
        self.win = MPI.Win.Allocate_shared(int(count) * self.dtype.itemsize,
                                           self.dtype.itemsize, comm=node.comm)
        """The MPI shared-memory window (``Win.Allocate_shared``) the segments live in; freed by
        ``free``."""
        self.segments: list[np.ndarray] = []
        """Rank q's segment as a numpy array in this process's memory (``segments[node rank]``):
        writes by one rank are read by the others after a ``fence``."""
        for q in range(node.size):
            memory, _ = self.win.Shared_query(q)
            n = len(memory) // self.dtype.itemsize
            self.segments.append(np.ndarray((n,), self.dtype, buffer=memory) if n
                                 else np.empty(0, self.dtype))
        self.win.Lock_all(MPI.MODE_NOCHECK)  # a passive epoch for Win_sync (no lock is taken)

    @classmethod
    def on_first(cls, node: MPICommunicator, values: np.ndarray,
                 polling: bool = False) -> SharedSegments:
        """One array for the whole node, in the first rank's segment, holding its ``values``
        (collective; every rank passes an array of the same size and dtype)."""
        shared = cls(node, values.size if node.rank == 0 else 0, values.dtype, polling)
        if node.rank == 0:
            np.copyto(shared.segments[0], values.ravel())
        shared.fence()
        return shared

    def sync(self) -> None:
        """This rank's writes visible to the others, theirs to it (a memory barrier, not a lock,
        not collective: Hogwild's ranks each call it between steps)."""
        self.win.Sync()

    def fence(self) -> None:
        """Every rank's writes so far visible to every rank (collective over the node)."""
        self.win.Sync()
        if self.polling:
            request = self.node.comm.Ibarrier()
            while not request.Test():
                os.sched_yield()
        else:
            self.node.barrier()
        self.win.Sync()

    def free(self) -> None:
        """Release the window (collective); arrays taken from ``segments`` become invalid."""
        self.segments = []
        self.win.Unlock_all()
        self.win.Free()
