"""A two-level parameter server (seed 004; Gupta et al.'s Rudra, DistBelief's servers as a tree).

With one level, every worker's gradient lands on the server: P messages a step on one rank's
link. Here the workers are cut into groups of ``fan_in``; the first worker of each group is its
*aggregator*: it receives its group's gradients, forwards their mean as one message to the
global server, fetches the new parameters and hands them back to its group. The global server
is Downpour's ``ShardServer`` on each of the last ``servers`` ranks (a contiguous shard each),
which applies a push with the wrapped optimizer's rule as it arrives. So the global tier
receives ``ceil(W / fan_in)`` gradients a step instead of ``W``: ``fan_in`` times fewer bytes.

Within a group the step is synchronous (one larger batch); between groups it is asynchronous,
as between Downpour's workers: each group waits for its own answer only, and the servers record
the staleness of every push. With one group it is a consistent parameter server.

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> opt = HierarchicalParameterServer(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()  # size 1: trains locally
[0.8]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import poll_all, poll_barrier
from meta.lv3.flat import shard_bounds
from meta.lv3.parameter_server.shard_server import (
    DONE,
    FETCH,
    PARAMS,
    PUSH,
    ShardServer,
    StalenessLog,
    say_if_rule_is_split,
)
from meta.lv3.strategy import Strategy

UP, DOWN = tags.HIERARCHY  # gradients to the aggregator, parameters back to the group


class HierarchicalParameterServer(Strategy):
    """Workers in groups of ``fan_in`` behind one aggregator each; ``servers`` global shards."""

    name = "hierarchical_ps"
    consistent = False
    options = {"servers": Option(1, "global server shards (the last ranks; they do not train)",
                                 low=1),
               "fan_in": Option(2, "workers per aggregator (the first of each group)", low=1)}

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None, *,
                 servers: int = 1, fan_in: int = 2, **options: Any) -> None:
        comm = world() if comm is None else comm
        for key, value in (("servers", servers), ("fan_in", fan_in)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ComponentError(f"distributed 'hierarchical_ps': {key} must be an integer "
                                     f">= 1, got {value!r}")
        if comm.size > 1 and servers >= comm.size:
            raise ComponentError(f"distributed 'hierarchical_ps': servers={servers} leaves no "
                                 f"worker among {comm.size} ranks; run with more ranks or "
                                 "fewer servers")
        super().__init__(optimizer, comm, **options)
        n_servers = servers if comm.size > 1 else 0
        self.servers = list(range(comm.size - n_servers, comm.size))
        """The servers' ranks: the last ``n_servers``."""
        self.workers = list(range(comm.size - n_servers))
        """The workers' ranks: all but the servers."""
        self.fan_in = min(fan_in, len(self.workers))
        """Workers per team: each team's first worker (its aggregator) sums the team's gradients
        and pushes them."""
        self.aggregators = self.workers[::self.fan_in]
        """The aggregators' ranks: every ``fan_in``-th worker."""
        self.role = "server" if comm.rank in self.servers else "worker"
        self.consistent = len(self.aggregators) == 1
        self.group = comm.split(int(self.role == "server")) if self.servers else comm
        # The ranks of this worker's group, its aggregator first (servers: none).
        first = comm.rank - comm.rank % self.fan_in
        self.team = [] if self.role == "server" else \
            list(range(first, min(first + self.fan_in, len(self.workers))))
        """The worker indices of this rank's team (empty on a server)."""
        self.bounds = shard_bounds(len(self.flat_params), max(n_servers, 1))
        """Each server's shard of the flat parameters, as (start, end) offsets."""
        say_if_rule_is_split(self.name, optimizer.transform, n_servers, comm.rank == 0)
        self.staleness = StalenessLog(len(self.aggregators))
        """The staleness of the pushes a server applied, and pushes per aggregator."""
        self.global_bytes_received = 0.0
        """by the servers, summed at the end (every rank)"""
        self.worker_steps = 0
        """a worker's steps (the most of any), known at the end"""
        self.inbox = np.empty((max(len(self.team) - 1, 0), len(self.flat_grads)),
                              self.flat_grads.dtype) if self.is_aggregator else None
        """An aggregator's rows for its team mates' gradients; None elsewhere."""
        if self.role == "server":
            lo, hi = self.bounds[self.servers.index(comm.rank)]
            shard = Optimizer(optimizer.transform, {"shard": self.flat_params.buffer[lo:hi]})
            self.server = ShardServer(comm, shard, self.aggregators, self.staleness,
                                      self.timeline)
            """This server rank's shard server (servers only)."""

    @property
    def is_aggregator(self) -> bool:
        return bool(self.team) and self.team[0] == self.comm.rank

    @classmethod
    def replica(cls, rank: int, size: int, servers: int = 1, **options: Any) -> tuple[int, int]:
        workers = size - servers if size > 1 else 1
        return (rank, workers) if 0 <= rank < workers else (0, 1)

    def step(self, grads: Params) -> None:
        t = self.timeline
        t.begin()
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        if not self.servers:
            self.optimizer.step(self.flat_grads.views)
            t.lap("update")
        elif self.is_aggregator:
            self._aggregate(buffer)
        else:
            comm, leader, params = self.comm, self.team[0], self.flat_params.buffer
            poll_all(comm, [comm.isend(buffer, leader, UP), comm.irecv(params, leader, DOWN)])
            self.bytes_sent += buffer.nbytes
            t.lap("communicate")

    def _aggregate(self, buffer: np.ndarray) -> None:
        """Sum the group's gradients, push their mean to every shard, fetch, pass it on."""
        comm, t, params = self.comm, self.timeline, self.flat_params.buffer
        members = self.team[1:]
        poll_all(comm, [comm.irecv(row, m, UP) for row, m in zip(self.inbox, members)])
        t.lap("communicate")
        for row in self.inbox:
            buffer += row
        buffer *= 1.0 / len(self.team)
        t.lap("unpack")
        pieces = list(zip(self.servers, self.bounds))
        requests = [comm.irecv(params[lo:hi], s, PARAMS) for s, (lo, hi) in pieces]
        requests += [comm.isend(buffer[lo:hi], s, PUSH) for s, (lo, hi) in pieces]
        requests += [comm.isend(buffer[:0], s, FETCH) for s in self.servers]
        poll_all(comm, requests)  # a server answers a FETCH after the push sent before it
        poll_all(comm, [comm.isend(params, m, DOWN) for m in members])
        self.bytes_sent += buffer.nbytes * len(self.team)
        t.lap("communicate")

    def finish(self) -> None:
        if not self.servers:
            return
        if self.is_aggregator:
            poll_all(self.comm, [self.comm.isend(self.flat_grads.buffer[:0], s, DONE)
                                 for s in self.servers])
        self._final()

    def serve(self) -> None:
        if self.role != "server":
            super().serve()
        self.server.run()
        lo, hi = self.bounds[self.servers.index(self.comm.rank)]
        self.global_bytes_received = float(self.staleness.pushes.sum()) * (hi - lo) * \
            self.flat_params.dtype.itemsize
        self._final()

    def _final(self) -> None:
        """Collective: every rank gets every shard, the staleness counts and the bytes the
        global tier received (a barrier that sleeps first: servers may still be serving)."""
        poll_barrier(self.comm)
        for root, (lo, hi) in zip(self.servers, self.bounds):
            self.comm.bcast(self.flat_params.buffer[lo:hi], root=root)
        self.staleness.merge(self.comm)
        received = np.array([self.global_bytes_received])
        self.comm.allreduce(received)
        self.global_bytes_received = float(received[0])
        steps = np.array([self.timeline.steps if self.role == "worker" else 0])
        self.worker_steps = int(self.comm.allreduce(steps, op="max")[0])

    def report(self) -> dict[str, float]:
        out = super().report()
        if self.servers:
            steps = max(self.worker_steps, 1)
            out.update(global_server_bytes_per_step=self.global_bytes_received / steps,
                       aggregators=float(len(self.aggregators)), fan_in=float(self.fan_in))
            out.update(self.staleness.metrics())
        return out

    def report_text(self) -> str:
        if not self.servers:
            return ""
        steps = max(self.worker_steps, 1)
        one_level = len(self.workers) * self.flat_params.nbytes
        return (f"meta: global server ({len(self.servers)} shard(s)) received "
                f"{self.global_bytes_received / steps:.0f} bytes per step from "
                f"{len(self.aggregators)} aggregator(s) of fan-in {self.fan_in}; one level "
                f"would take {one_level} bytes from {len(self.workers)} workers "
                f"({one_level * steps / max(self.global_bytes_received, 1):.2f}x more)\n"
                + self.staleness.format())

    def predict_comm_s(self, link: Link) -> float:
        """An aggregator's step: its group's gradients in and parameters out one after
        another, and a push and a fetch per shard (servers answer in parallel)."""
        if not self.servers:
            return 0.0
        n, shards = self.flat_params.nbytes, len(self.servers)
        return 2 * (self.fan_in - 1) * link.message(n) + 2 * link.message(math.ceil(n / shards))
