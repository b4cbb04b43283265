"""Asynchronous SGD through MPI one-sided communication (seed 000: MPI_Put / MPI_Get on a window).

The parameters live in a window that the server rank (the last) allocates with
``MPI.Win.Allocate`` (15-20x faster here than ``Win.Create`` for one-sided updates). Workers
never talk to a server process: each step adds its update to the window with ``Accumulate``
(SUM, element-wise atomic) and reads the new parameters back with ``Get``. The server rank runs
no loop; it sleeps in a barrier until the workers are done.

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> opt = AsyncRMA(Optimizer(sgd(0.1), {"w": np.array([1.0])}))  # size 1: trains locally
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
[0.8]
"""

from __future__ import annotations

import numpy as np

from meta.lv2.optimizers import Params
from meta.lv3.communicator import Communicator, MPICommunicator, _import_mpi
from meta.lv3.parameter_server import AsyncParameterServer
from meta.lv3.polling import poll_barrier


class Window:
    """``n`` values of ``dtype`` exposed by rank ``owner`` of ``comm`` (every other rank exposes
    none), read and updated under passive-target locks. Creating and ``free`` are collective."""

    def __init__(self, comm: Communicator, owner: int, n: int, dtype: np.dtype) -> None:
        if not isinstance(comm, MPICommunicator):
            raise TypeError(f"Window: one-sided communication needs an MPICommunicator, "
                            f"got {comm!r}")
        self.MPI = _import_mpi()
        self.owner, self.dtype = owner, np.dtype(dtype)
        local = n * self.dtype.itemsize if comm.rank == owner else 0
        self.win = self.MPI.Win.Allocate(local, self.dtype.itemsize, comm=comm.comm)
        self.memory = np.frombuffer(self.win.tomemory(), self.dtype) if local else None

    def write_local(self, values: np.ndarray) -> None:
        """The owner stores ``values`` into its own window memory."""
        self.win.Lock(self.owner, self.MPI.LOCK_EXCLUSIVE)
        np.copyto(self.memory, values)
        self.win.Unlock(self.owner)

    def read(self, out: np.ndarray) -> np.ndarray:
        """Copy the window into ``out`` (a shared lock: readers do not exclude each other)."""
        self.win.Lock(self.owner, self.MPI.LOCK_SHARED)
        self.win.Get(out, self.owner)
        self.win.Unlock(self.owner)
        return out

    def add_and_read(self, delta: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Add ``delta`` to the window, then read the sum into ``out``, in one exclusive epoch.

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


class AsyncRMA(AsyncParameterServer):
    """Inconsistent SGD against parameters in a one-sided window on the last rank.

    A worker's ``step`` runs the wrapped optimizer on its local copy (any Level 2 rule, state
    kept per worker), accumulates the resulting change ``new - old`` into the window, and reads
    the window back: other workers' updates arrive in between, unordered and unannounced.
    Staleness is not tracked (no rank counts updates; see ``Downpour`` for that). ``finish`` /
    ``serve`` meet in a barrier, then every rank gets the window's final parameters.
    At size 1 there is no window: the rank trains locally.
    """

    name = "async_rma"

    def __init__(self, optimizer, comm: Communicator | None = None, **options) -> None:
        super().__init__(optimizer, comm, **options)
        self.window: Window | None = None
        if self.server is not None:
            buffer = self.flat_params.buffer
            self.window = Window(self.comm, self.server, buffer.size, buffer.dtype)
            if self.role == "server":
                self.window.write_local(buffer)
            self.comm.barrier()  # no Get before the server has filled the window
            self.before = np.empty_like(buffer)

    def step(self, grads: Params) -> None:
        t = self.timeline
        t.begin()
        self.flat_grads.pack(grads)
        t.lap("pack")
        if self.window is None:
            self.optimizer.step(self.flat_grads.views)
            t.lap("update")
            return
        params = self.flat_params.buffer
        np.copyto(self.before, params)
        self.optimizer.step(self.flat_grads.views)
        np.subtract(params, self.before, out=self.before)  # the update, in place
        t.lap("update")
        self.window.add_and_read(self.before, params)
        self.bytes_sent += params.nbytes
        t.lap("communicate")

    def _final(self) -> None:
        """Collective end: wait for every rank, then all take the window's parameters."""
        poll_barrier(self.comm)
        if self.role == "server":
            self.window.read(self.flat_params.buffer)
        self.comm.bcast(self.flat_params.buffer, root=self.server)
        self.window.free()

    def finish(self) -> None:
        if self.window is not None:
            self._final()

    def serve(self) -> None:
        """The server rank: nothing to do but wait (the window is updated by the workers)."""
        if self.role != "server":
            super().serve()
        self._final()
