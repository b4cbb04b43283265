"""Asynchronous SGD through MPI one-sided communication (seed 000: MPI_Put / MPI_Get on a window).

The parameters live in a window (``comm.window``) that the server rank (the last) allocates
with ``MPI_Win_allocate`` (15-20x faster here than ``Win.Create`` for one-sided updates). Workers
never talk to a server process: each step adds its update to the window with ``Accumulate``
(SUM, element-wise atomic) and reads the new parameters back with ``Get``. The server rank runs
no loop; it waits (polling) for each worker's DONE. One counter per worker after the parameters
in the window counts the updates each applied (in the same ``Accumulate``), so a worker that
dies (survived under ULFM, as the parameter server does) is reported with its updates applied.

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> opt = AsyncRMA(Optimizer(sgd(0.1), {"w": np.array([1.0])}))  # size 1: trains locally
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
[0.8]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from meta.lv2.optimizers import Params
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import poll_all, poll_any_until
from meta.lv3.comm.survival import lost
from meta.lv3.comm.window import Window
from meta.lv3.parameter_server.central import DONE, ROSTER, AsyncParameterServer
from meta.lv3.parameter_server.shard_server import DIED, FINISHED


class AsyncRMA(AsyncParameterServer):
    """Inconsistent SGD against parameters in a one-sided window on the last rank.

    A worker's ``step`` runs the wrapped optimizer on its local copy (any Level 2 rule, state
    kept per worker), accumulates the resulting change ``new - old`` into the window, and reads
    the window back: other workers' updates arrive in between, unordered and unannounced.
    Staleness is not tracked (see ``Downpour`` for that); each worker's updates are counted.
    Each worker sends the server DONE at the end and gets the roster back; then every rank
    gets the window's final parameters. At size 1 there is no window: the rank trains locally.

    A worker that dies between its updates is survived (under ULFM) like the parameter
    server's. One that dies inside its update holds the window's lock for ever (Open MPI's
    shared-memory windows are not fault tolerant): the other workers then stop making
    progress, and after ``stall_s`` seconds without any the server ends the run with a
    ``LostRankError`` naming the dead worker, rather than let it hang.
    """

    name = "async_rma"
    stall_s = 5.0
    """after a death, seconds without an update before the run is given up"""
    worker_steps: list[int] | None = None
    """On the server of a run started afresh: each worker's steps in the whole run, so that
    workers that have made all their updates (evaluating, finishing) are not taken for
    workers a dead one's lock holds up (they were, 6 of 6 times, after the last epoch)."""
    workload: Any = None
    """The server's: the run's rows and batch size, from which it counts the workers' steps."""

    @classmethod
    def from_recipe(cls, optimizer: Any, comm: Communicator, workload: Any,
                    **options: Any) -> AsyncRMA:
        """Also: the server keeps the workload, to count the workers' steps."""
        strategy = super().from_recipe(optimizer, comm, workload, **options)
        if strategy.role == "server":
            strategy.workload = workload
        return strategy

    def train(self, trainer, epochs: int) -> list[dict[str, Any]]:
        """Also: the server counts each worker's steps in the run (where it starts afresh)."""
        workload = self.workload
        if self.role == "server" and workload is not None and trainer.step == 0:
            # as the runner's DistributedSampler shares the rows: ceil(rows / workers) each,
            # in batches of batch_size, the last one short
            rows = -(-len(workload.train_data) // len(self.workers))
            self.worker_steps = [epochs * -(-rows // workload.batch_size)] * len(self.workers)
        return super().train(trainer, epochs)

    def __init__(self, optimizer, comm: Communicator | None = None, **options) -> None:
        super().__init__(optimizer, comm, **options)
        self.window: Window | None = None
        """The server's window: the flat parameters, then one update counter per worker; None on
        one process."""
        if self.server is not None:
            buffer, n = self.flat_params.buffer, self.flat_params.buffer.size
            self.window = Window(self.comm, self.server, n + len(self.workers), buffer.dtype)
            if self.role == "server":
                self.window.write_local(buffer)
            self.comm.barrier()  # no Get before the server has filled the window
            self.before = np.zeros(n + len(self.workers), buffer.dtype)
            """What a worker accumulates into the window with each update: its negated step, and
            1 on its own counter."""
            if self.role == "worker":  # this worker's counter goes up by one with each update
                self.before[n + self.workers.index(self.comm.rank)] = 1
                self.verdict = self.comm.irecv(self.roster.info, self.server, ROSTER)
                """Answered at the end; until then, testing it notices a dead server."""

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
        update = self.before[: params.size]
        np.copyto(update, params)
        self.optimizer.step(self.flat_grads.views)
        np.subtract(params, update, out=update)  # the update, in place
        t.lap("update")
        self.window.add_and_read(self.before, params)
        self.steps += 1
        self.bytes_sent += params.nbytes
        t.lap("communicate")
        self._talk([self.verdict], wait=False)  # a dead server: a LostRankError naming it

    def _final(self) -> None:
        """The end, over the ranks that finished: all take the window's parameters."""
        params = self.flat_params.buffer
        if self.role == "server" and self.roster.died():  # the dead may hold the lock
            np.copyto(params, self.window.memory[: params.size])
        elif self.role == "server":
            self.window.read(params)
        self.end_comm.bcast(params, root=self.end_comm.size - 1)
        if not self.roster.died():  # freeing is collective over every rank, dead ones too
            self.window.free()

    def finish(self) -> None:
        if self.window is not None:
            self._talk([self.comm.isend(np.empty(0, self.before.dtype), self.server, DONE),
                        self.verdict])
            self._end_with_survivors()
            self._final()

    def serve(self) -> None:
        """The server rank: wait for every worker's DONE (the window is updated by the
        workers), drop those that die, send the roster to the others."""
        if self.role != "server":
            super().serve()
        comm, n = self.comm, self.flat_params.buffer.size
        counts = self.window.memory[n:]  # each worker's updates applied so far
        boxes = [np.empty(0, self.before.dtype) for _ in self.workers]
        receives = [comm.irecv(box, w, DONE) for box, w in zip(boxes, self.workers)]
        active, started, deadline = set(range(len(self.workers))), time.monotonic(), np.inf
        seen = counts.copy()
        while active:
            try:
                got = poll_any_until(comm, receives, deadline)
            except Exception as err:  # a worker died (under ULFM): go on without it
                self.roster.drop_dead(err, comm, active, [receives], counts, started)
                deadline, seen = time.monotonic() + self.stall_s, counts.copy()
                continue
            if got is None:  # since a death, no update for stall_s
                self._check_progress(active, seen, counts)
                deadline, seen = time.monotonic() + self.stall_s, counts.copy()
                continue
            i = got[0]
            self.roster.mark(i, FINISHED, steps=counts[i], pushes=counts[i])
            active.discard(i)
        alive = [w for i, w in enumerate(self.workers) if self.roster.status(i) != DIED]
        poll_all(comm, [comm.isend(self.roster.info, w, ROSTER) for w in alive])
        self._end_with_survivors()
        self._final()

    def _check_progress(self, active: set[int], seen: np.ndarray, counts: np.ndarray) -> None:
        """Raise ``LostRankError`` when no active worker updated the window since ``seen``:
        a dead worker holds its lock."""
        if any(counts[i] != seen[i] for i in active):
            return
        died, total = self.roster.died()[0], self.worker_steps
        if total is not None and (counts[died] >= total[died] or
                                  all(counts[i] >= total[i] for i in active)):
            return  # the dead made its last update, or the others need the window no more
        dead = self.workers[died]
        raise lost(dead, self.comm.size, "worker",
                   f"during its update of the window (it holds the window's lock, and the "
                   f"other workers made no update for {self.stall_s:.0f} s)")
