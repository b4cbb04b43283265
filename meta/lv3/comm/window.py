"""One-sided communication: a window of memory one rank exposes, read and updated by the others
under passive-target locks (MPI_Win_allocate, MPI_Accumulate, MPI_Get).

``async_rma`` keeps its parameters in one; nothing outside ``comm/`` touches the MPI window.
"""

from __future__ import annotations

import numpy as np

from meta.lv3.comm.communicator import Communicator, MPICommunicator, _import_mpi


class Window:
    """``n`` values of ``dtype`` exposed by rank ``owner`` of ``comm`` (every other rank exposes
    none), read and updated under passive-target locks. Creating and ``free`` are collective."""

    def __init__(self, comm: Communicator, owner: int, n: int, dtype: np.dtype) -> None:
        if not isinstance(comm, MPICommunicator):
            raise TypeError(f"Window: one-sided communication needs an MPICommunicator, "
                            f"got {comm!r}")
        self.MPI = _import_mpi()
        """The mpi4py ``MPI`` module (its lock constants and types)."""
        self.owner, self.dtype = owner, np.dtype(dtype)
        """``owner``: the rank whose memory it exposes. ``dtype``: the values'."""
        local = n * self.dtype.itemsize if comm.rank == owner else 0
        self.win = self.MPI.Win.Allocate(local, self.dtype.itemsize, comm=comm.comm)
        """The MPI window over the owner's memory (``Win.Allocate``); freed by ``free``."""
        self.memory = np.frombuffer(self.win.tomemory(), self.dtype) if local else None
        """The owner's window memory as a numpy array of ``dtype``; None on the other ranks."""

    def write_local(self, values: np.ndarray) -> None:
        """The owner stores ``values`` at the start of its own window memory, zeros after."""
        self.win.Lock(self.owner, self.MPI.LOCK_EXCLUSIVE)
        self.memory[values.size :] = 0
        np.copyto(self.memory[: values.size], values)
        self.win.Unlock(self.owner)

    def read(self, out: np.ndarray) -> np.ndarray:
        """Copy the window's first ``out.size`` values into ``out`` (a shared lock: readers do
        not exclude each other)."""
        self.win.Lock(self.owner, self.MPI.LOCK_SHARED)
        self.win.Get(out, self.owner)
        self.win.Unlock(self.owner)
        return out

    def add_and_read(self, delta: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Add ``delta`` to the window, then read its first ``out.size`` values into ``out``,
        in one exclusive epoch.

        ``Flush`` completes the accumulate at the target before the ``Get`` is issued: the
        operations of one epoch are otherwise unordered.
        """
        self.win.Lock(self.owner, self.MPI.LOCK_EXCLUSIVE)
        self.win.Accumulate(delta, self.owner, op=self.MPI.SUM)
        self.win.Flush(self.owner)
        self.win.Get(out, self.owner)
        self.win.Unlock(self.owner)
        return out

    def free(self) -> None:
        self.win.Free()
