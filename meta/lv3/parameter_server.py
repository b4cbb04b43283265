"""Parameter servers: consistent (gather, update at the root, broadcast) and asynchronous."""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.communicator import Communicator, world
from meta.lv3.costmodel import Link, gather_bcast
from meta.lv3.flat import FlatBuffer
from meta.lv3.polling import poll_all, poll_any
from meta.lv3.strategy import Strategy

GRADS, PARAMS, DONE, ORDER = 11, 12, 13, 14  # message tags of the asynchronous server


class ParameterServer(Strategy):
    """Seed 002's flow: ``Gather`` the gradients at rank 0, which averages them and steps the
    wrapped optimizer, then ``Bcast`` the parameters. Only the root's optimizer state is used.

    With plain SGD it computes exactly what ``Allreduce`` does; bit for bit when the root sums
    in the same order as MPI's allreduce (always at 2 ranks: addition commutes).
    """

    name = "parameter_server"

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
    The server records the order in which it applied the workers' gradients and sends it to
    rank 0 at the end (``update_order``: the worker rank of each update), so the run can be
    replayed on one process, bit for bit (``meta replay``).
    Server and workers wait by polling (``meta.lv3.polling``): MPICH's blocking waits spin,
    and with more ranks than cores a spinning server takes a core its workers need.
    """

    name = "async_parameter_server"
    pretraining = "exchange"
    consistent = False

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None, **options) -> None:
        comm = world() if comm is None else comm
        self.server = comm.size - 1 if comm.size > 1 else None
        super().__init__(optimizer, comm, **options)
        self.role = "server" if comm.rank == self.server else "worker"
        self.group = comm.split(int(self.role == "server"))
        self.workers = [r for r in range(comm.size) if r != self.server]
        self.update_order: list[int] | None = None  # on the server and rank 0, once finished

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
        poll_all(comm, [comm.isend(buffer, self.server, GRADS),
                        comm.irecv(self.flat_params.buffer, self.server, PARAMS)])
        self.bytes_sent += buffer.nbytes
        t.lap("communicate")

    def finish(self) -> None:
        if self.role == "worker" and self.server is not None:
            self.comm.send(np.empty(0, self.flat_grads.dtype), self.server, DONE)
            self.comm.recv(self.flat_params.buffer, self.server, PARAMS)
            if self.comm.rank == 0:
                count = np.empty(1, np.int64)
                self.comm.recv(count, self.server, ORDER)
                order = np.empty(int(count[0]), np.int64)
                self.comm.recv(order, self.server, ORDER)
                self.update_order = order.tolist()

    def serve(self) -> None:
        """Apply gradients as they come until every worker is done (the server rank only)."""
        if self.role != "server":
            super().serve()
        comm, t, params = self.comm, self.timeline, self.flat_params.buffer
        inboxes = [FlatBuffer(self.flat_grads.shapes, self.flat_grads.dtype) for _ in self.workers]
        outboxes = [np.empty_like(params) for _ in self.workers]
        receives = [comm.irecv(box.buffer, w) for box, w in zip(inboxes, self.workers)]
        sends: list = [None] * len(self.workers)
        active, order = len(self.workers), []
        while active:
            t.begin()
            i, tag = poll_any(comm, receives)  # a blocking wait would spin on a worker's core
            t.lap("communicate")
            if tag == DONE:
                active -= 1
                continue
            self.optimizer.step(inboxes[i].views)
            order.append(self.workers[i])
            t.lap("update")
            if sends[i] is not None:
                poll_all(comm, [sends[i]])  # the worker got it before sending this gradient
            np.copyto(outboxes[i], params)
            sends[i] = comm.isend(outboxes[i], self.workers[i], PARAMS)
            receives[i] = comm.irecv(inboxes[i].buffer, self.workers[i])
            self.bytes_sent += params.nbytes
            t.lap("pack")
        poll_all(comm, sends)
        for worker in self.workers:
            comm.send(params, worker, PARAMS)
        self.update_order = order
        comm.send(np.array([len(order)], np.int64), 0, ORDER)
        comm.send(np.array(order, np.int64), 0, ORDER)

    def predict_comm_s(self, link: Link) -> float:
        """A worker's round trip, ignoring the queue at the server."""
        return 2 * link.message(self.flat_grads.nbytes) if self.server is not None else 0.0
