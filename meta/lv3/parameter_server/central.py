"""Parameter servers: consistent (gather, update at the root, broadcast) and asynchronous."""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from meta.common.component import Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.comm.costmodel import Link, gather_bcast
from meta.lv3.comm.polling import poll_all, poll_any, survivors_comm, test_all
from meta.lv3.comm.survival import follow_shrinks, is_failure, lost_peer, surviving
from meta.lv3.flat import FlatBuffer
from meta.lv3.parameter_server.shard_server import DIED, FINISHED, Roster
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload

GRADS, PARAMS, DONE, ORDER, ROSTER = tags.ASYNC_SERVER  # message tags of the async server


class ParameterServer(Strategy):
    """Seed 002's flow: ``Gather`` the gradients at rank 0, which averages them and steps the
    wrapped optimizer, then ``Bcast`` the parameters. Only the root's optimizer state is used.

    With plain SGD it computes exactly what ``Allreduce`` does; bit for bit when the root sums
    in the same order as MPI's allreduce (always at 2 ranks: addition commutes).
    """

    name = "parameter_server"
    options: ClassVar[dict[str, Option]] = {}
    """None of ``Strategy``'s: it never averages in chunks, so ``chunk_bytes`` would do
    nothing (``meta components`` lists only the options that apply)."""

    def step(self, grads: Params) -> None:
        t, comm = self.timeline, self.comm
        t.begin()
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        gathered = comm.gather(buffer, root=0)
        self.bytes_sent += buffer.nbytes if comm.size > 1 else 0
        t.lap("communicate")
        if comm.is_root:
            if comm.size > 1:
                np.sum(gathered, axis=0, out=buffer)
                buffer *= 1.0 / comm.size
            t.lap("unpack")
            self.optimizer.step(self.flat_grads.views)
            t.lap("update")
        comm.bcast(self.flat_params.buffer, root=0)
        self.bytes_sent += self.flat_params.nbytes if comm.is_root and comm.size > 1 else 0
        t.lap("communicate")

    def predict_comm_s(self, link: Link) -> float:
        return gather_bcast(link, self.comm.size, self.flat_grads.nbytes)


class AsyncParameterServer(Strategy):
    """Inconsistent (asynchronous) SGD: the last rank is a server that does not train.

    A worker's ``step`` sends its gradient (tag GRADS) and receives fresh parameters (tag
    PARAMS), both nonblocking; it waits for the server only, never for other workers. The
    server (``serve``) applies each gradient as it arrives with the wrapped optimizer and
    answers that worker alone, until every worker has sent DONE (``finish``); then it sends
    everyone the final parameters. At size 1 there is no server: the rank trains locally.
    The server records the order in which it applied the workers' gradients and sends it at
    the end to the first worker alive, which writes the outputs (``update_order``: the worker
    rank of each update), so the run can be replayed on one process, bit for bit
    (``meta replay``).
    Server and workers wait by polling (``meta.lv3.comm.polling``): MPICH's blocking waits spin,
    and with more ranks than cores a spinning server takes a core its workers need.

    A worker whose process dies is survived under an MPI with ULFM (``meta.lv3.comm.survival``):
    the server drops it (``Roster``: DIED, when, its updates applied) and sends the roster to
    the others with the final parameters; the workers' collectives shrink to the survivors,
    and the end of the run (``end_comm``) is theirs alone; when rank 0 died, the first worker
    alive writes the outputs. A dead server is a ``LostRankError`` naming it.
    """

    name = "async_parameter_server"
    options: ClassVar[dict[str, Option]] = {}
    """None of ``Strategy``'s: it never averages in chunks, so ``chunk_bytes`` would do
    nothing (``meta components`` lists only the options that apply)."""
    pretraining = "exchange"
    consistent = False

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None, **options) -> None:
        comm = world() if comm is None else comm
        self.server = comm.size - 1 if comm.size > 1 else None
        """The server's rank (the last one), or None on one process."""
        super().__init__(optimizer, comm, **options)
        self.role = "server" if comm.rank == self.server else "worker"
        self.group = surviving(comm.split(int(self.role == "server")))
        self.workers = [r for r in range(comm.size) if r != self.server]
        """The workers' ranks: every rank but the server."""
        self.update_order: list[int] | None = None
        """on the server and rank 0, once finished"""
        self.roster = Roster(self.workers)
        """the server's, sent to the workers at the end"""
        self.end_comm = comm
        """the ranks that finished the run (all, unless a worker died)"""
        self.steps = self.steps_per_epoch = 0
        """``steps``: local steps done. ``steps_per_epoch``: the steps of a loss's epoch."""

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    **options: Any) -> AsyncParameterServer:
        """Also: the evaluation is re-sharded when a worker dies (under ULFM)."""
        strategy = cls(optimizer, comm, **options)
        if workload is not None:  # built from a recipe (else around a bare optimizer)
            follow_shrinks(strategy.group, workload.reshard_evaluation)
            strategy.steps_per_epoch = workload.steps_per_epoch
        return strategy

    def _talk(self, requests: list, wait: bool = True) -> None:
        """A worker's wait for (or, ``wait=False``, test of) its exchange with the server;
        the server's death is a ``LostRankError`` naming it."""
        try:
            poll_all(self.comm, requests) if wait else test_all(self.comm, requests)
        except Exception as err:
            if not is_failure(err):
                raise
            raise lost_peer(self.comm, [self.server],
                            f"at step {self.steps} of worker {self.comm.rank}") from err

    def _alive(self) -> list[int]:
        """The workers that finished (all, unless one died), as the roster says."""
        return [w for i, w in enumerate(self.workers) if self.roster.status(i) != DIED]

    def _end_with_survivors(self) -> None:
        """After a death, the rest of the run is collective over the survivors only."""
        if self.roster.died():
            self.end_comm = survivors_comm(self.comm, sorted(self._alive() + [self.server]),
                                           died=True)

    @property
    def source(self) -> int:
        return self.comm.size - 1

    @classmethod
    def replica(cls, rank: int, size: int, **options: Any) -> tuple[int, int]:
        return (rank, size - 1) if 0 <= rank < size - 1 else (0, 1)

    def step(self, grads: Params) -> None:
        t, comm = self.timeline, self.comm
        t.begin()
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        if self.server is None:
            self.optimizer.step(self.flat_grads.views)
            t.lap("update")
            return
        self._talk([comm.isend(buffer, self.server, GRADS),
                    comm.irecv(self.flat_params.buffer, self.server, PARAMS)])
        self.steps += 1
        self.bytes_sent += buffer.nbytes
        t.lap("communicate")

    def finish(self) -> None:
        if self.role == "worker" and self.server is not None:
            comm, server = self.comm, self.server
            self._talk([comm.isend(np.empty(0, self.flat_grads.dtype), server, DONE),
                        comm.irecv(self.roster.info, server, ROSTER)])
            self._talk([comm.irecv(self.flat_params.buffer, server, PARAMS)])
            if comm.rank == self._alive()[0]:  # the writer of the outputs
                count = np.empty(1, np.int64)
                self._talk([comm.irecv(count, server, ORDER)])
                order = np.empty(int(count[0]), np.int64)
                self._talk([comm.irecv(order, server, ORDER)])
                self.update_order = order.tolist()
            self._end_with_survivors()

    def serve(self) -> None:
        """Apply gradients as they come until every worker is done (the server rank only)."""
        if self.role != "server":
            super().serve()
        comm, t, params = self.comm, self.timeline, self.flat_params.buffer
        inboxes = [FlatBuffer(self.flat_grads.shapes, self.flat_grads.dtype) for _ in self.workers]
        outboxes = [np.empty_like(params) for _ in self.workers]
        receives = [comm.irecv(box.buffer, w) for box, w in zip(inboxes, self.workers)]
        sends: list = [None] * len(self.workers)
        active, order = set(range(len(self.workers))), []
        applied, started = np.zeros(len(self.workers)), time.monotonic()
        while active:
            t.begin()
            try:
                i, tag = poll_any(comm, receives)  # a blocking wait would spin on a core
            except Exception as err:  # a worker died (under ULFM): go on without it
                self.roster.drop_dead(err, comm, active, [receives, sends], applied, started)
                continue
            t.lap("communicate")
            if tag == DONE:
                self.roster.mark(i, FINISHED, steps=applied[i], pushes=applied[i])
                active.discard(i)
                continue
            self.optimizer.step(inboxes[i].views)
            order.append(self.workers[i])
            applied[i] += 1
            t.lap("update")
            if sends[i] is not None:
                poll_all(comm, [sends[i]])  # the worker got it before sending this gradient
            np.copyto(outboxes[i], params)
            sends[i] = comm.isend(outboxes[i], self.workers[i], PARAMS)
            receives[i] = comm.irecv(inboxes[i].buffer, self.workers[i])
            self.bytes_sent += params.nbytes
            t.lap("pack")
        alive = self._alive()
        poll_all(comm, [s for i, s in enumerate(sends) if self.roster.status(i) != DIED])
        for worker in alive:
            comm.send(self.roster.info, worker, ROSTER)
            comm.send(params, worker, PARAMS)
        self.update_order = order
        comm.send(np.array([len(order)], np.int64), alive[0], ORDER)
        comm.send(np.array(order, np.int64), alive[0], ORDER)
        self._end_with_survivors()

    def report(self) -> dict[str, float]:
        out = super().report()
        if self.server is not None:
            out.update(self.roster.death_metrics(self.steps_per_epoch))
        return out

    def report_text(self) -> str:
        """One line per worker that died (printed by rank 0)."""
        return "\n".join("meta: " + line for line in self.roster.departures(self.steps_per_epoch))

    def predict_comm_s(self, link: Link) -> float:
        """A worker's round trip, ignoring the queue at the server."""
        return 2 * link.message(self.flat_grads.nbytes) if self.server is not None else 0.0
