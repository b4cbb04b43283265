"""Downpour SGD (seed 001: DistBelief, Algorithm 1.1 DOWNPOURSGDCLIENT(alpha, n_fetch, n_push)).

The parameter vector is cut into ``servers`` contiguous shards of the flat buffer, each held by
one of the last ``servers`` ranks, which applies pushed gradients with its own copy of a Level 2
rule (DistBelief used Adagrad; here the wrapped optimizer's rule unless ``server_rule`` is
given). The other ranks are workers running the client loop: every ``n_fetch`` steps they start
fetching fresh parameters, every ``n_push`` steps they start pushing their accrued gradients,
all nonblocking (Isend / Irecv with tags), and in between they step locally with the wrapped
optimizer (``parameters <- parameters - alpha * gradient``). A fetch's answer lands with the
worker's own moves the servers have not yet seen added back. Two waits keep a worker from
training on without fresh parameters (issue 8): its first step waits for the step-0 fetch, and
a fetch still out when the next is due is waited for, not skipped.

So a step's gradient is taken at the answer to the fetch before last (the one asked for after
the previous push lands at the end of this step): it lacks the other workers' pushes of one
more step. With ``blocking_fetch`` each fetch is waited for at once instead, and the next
gradient is taken at the servers' values just after this worker's push. It costs a round trip
a step, and it was what Adam on the server needed (issue 39: the Shakespeare GPT, two workers,
160 server updates: 2.815 nats/char nonblocking, 2.609 blocking, 2.403 for one process);
``meta replay`` and the virtual-time simulator follow the nonblocking client only, so a
blocking run records no schedule.

Warm start (DistBelief's trick against early instability): worker 0 trains alone for
``warm_start_steps`` steps, waits until the servers have applied its pushes, and sends the
others a go message; they wait for it in the constructor and then fetch its parameters.

Servers record the staleness of every applied push: their update count at the time minus the
count they had when they last answered that worker's fetch (``ShardServer``).

Workers that drop out (the seed: a failed replica "may be taken offline") do not stop the run.
A worker that calls ``leave(planned_steps)`` pushes what it has accrued, tells every server
(EXIT) and takes part in nothing after that. With ``worker_timeout_s`` the servers declare a
worker silent that long LOST and stop listening to it; if it comes back, its ``finish`` learns
that and returns without the final parameters. The servers agree on who is left (an allreduce
among the servers), the first server sends each remaining worker the verdict, and the end of
the run (final parameters, staleness counts) is collective over the survivors only, on a
communicator they build alone (``MPI_Comm_create_group``). ``departures()`` says what was lost.

A process that dies outright (a crash, SIGKILL, a lost node) is survived where the MPI has
the fault-tolerance extension ULFM (Open MPI's ``mpiexec --with-ft ulfm``; ``survival``): the
servers see the dead worker's receive fail and mark it DIED, the workers' per-epoch
collectives shrink to the survivors, and the end of the run goes on over the survivors as for
a lost worker; when it was rank 0, the lowest surviving worker writes the outputs. Losing a
server (or worker 0 during its warm start) is a ``LostRankError`` naming it. Without ULFM (the
``mpich`` wheel) the MPI standard leaves the job undefined and ``mpiexec`` ends every rank.
So ``worker_timeout_s`` covers a worker that is alive but stuck (or far too slow), and
``leave`` one that stops cleanly. A lost worker's unanswered messages are left pending: they
are small enough (here) for MPI's eager protocol, a very large push to a server that gave up
may not be.

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> opt = Downpour(Optimizer(sgd(0.1), {"w": np.array([1.0])}))  # size 1: trains locally
>>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
[0.8]
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from meta.common.component import Option
from meta.lv2.optimizers import GradientTransformation, Optimizer, Params
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import cancel_all, poll_all, poll_until, survivors_comm, test_all
from meta.lv3.comm.survival import follow_shrinks, is_failure, lost_peer, surviving
from meta.lv3.flat import shard_bounds
from meta.lv3.parameter_server.shard_server import (
    DIED,
    DONE,
    EXIT,
    FETCH,
    GO,
    LEFT,
    LOST,
    PARAMS,
    PUSH,
    VERDICT,
    Roster,
    ShardServer,
    StalenessLog,
    say_if_rule_is_split,
)
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload


class Downpour(Strategy):
    """Downpour SGD: workers fetch / push asynchronously against ``servers`` shard servers."""

    name = "downpour"
    consistent = False
    pretraining = "exchange"
    options = {"servers": Option(1, "parameter-server shards (the last ranks; they do not "
                                 "train)", low=1),
               "n_fetch": Option(1, "steps between parameter fetches", low=1),
               "n_push": Option(1, "steps between pushes of the accrued gradients", low=1),
               "warm_start_steps": Option(0, "steps worker 0 trains alone before the others "
                                          "join", low=0),
               "blocking_fetch": Option(False, "wait for each fetch's answer before the next "
                                        "step's gradient (staleness: only the pushes the "
                                        "other workers make meanwhile)")}

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None, *,
                 servers: int = 1, n_fetch: int = 1, n_push: int = 1,
                 warm_start_steps: int = 0, blocking_fetch: bool = False,
                 server_rule: GradientTransformation | None = None,
                 worker_timeout_s: float | None = None, **options) -> None:
        comm = world() if comm is None else comm
        for key, value, low in (("servers", servers, 1), ("n_fetch", n_fetch, 1),
                                ("n_push", n_push, 1), ("warm_start_steps", warm_start_steps, 0)):
            if int(value) != value or value < low:
                raise ValueError(f"Downpour: {key} must be an integer >= {low}, got {value!r}")
        if not isinstance(blocking_fetch, (bool, np.bool_)):
            raise ValueError(f"Downpour: blocking_fetch must be true or false, got "
                             f"{blocking_fetch!r}")
        if worker_timeout_s is not None and not worker_timeout_s > 0:
            raise ValueError(f"Downpour: worker_timeout_s must be > 0 seconds or None, got "
                             f"{worker_timeout_s!r}")
        if comm.size > 1 and servers >= comm.size:
            raise ValueError(f"Downpour: servers={servers} leaves no worker among "
                             f"{comm.size} ranks; run with more ranks or fewer servers")
        self.n_servers = servers if comm.size > 1 else 0
        """Servers, each holding one shard of the parameters (0 on one process)."""
        super().__init__(optimizer, comm, **options)
        self.n_fetch, self.n_push, self.warm_start_steps = n_fetch, n_push, warm_start_steps
        """``n_fetch``: steps between fetches of the parameters. ``n_push``: steps between pushes
        of the accrued gradients. ``warm_start_steps``: steps rank 0 trains alone before the
        other workers start."""
        self.blocking_fetch = bool(blocking_fetch)
        """Each fetch is waited for at once, so the next step's gradient is taken at the
        servers' values after this worker's own push, not one fetch older (``fetch_now``)."""
        self.servers = list(range(comm.size - self.n_servers, comm.size))
        """The servers' ranks: the last ``n_servers``."""
        self.workers = list(range(comm.size - self.n_servers))
        """The workers' ranks: all but the servers."""
        self.role = "server" if comm.rank in self.servers else "worker"
        self.group = surviving(comm.split(int(self.role == "server"))) if self.servers else comm
        self.steps_per_epoch = 0
        """known to the workers (from_recipe): a loss's epoch"""
        self.bounds = shard_bounds(len(self.flat_params), max(self.n_servers, 1))
        """Each server's shard of the flat parameters, as (start, end) offsets."""
        say_if_rule_is_split(self.name, server_rule or optimizer.transform, self.n_servers,
                             comm.rank == 0)
        self.staleness = StalenessLog(len(self.workers))
        """The staleness of the pushes a server applied, and pushes per worker (merged over the
        servers for the report)."""
        self.roster = Roster(self.workers, worker_timeout_s)
        """Per worker: status, steps, pushes, silence (``Roster``): who finished, left or died."""
        self.left = self.lost = False
        """this worker left / was declared lost"""
        self.end_comm = comm
        """the survivors, once the run has ended"""
        self.schedule: dict[str, Any] | None = None
        """rank 0's, once finished (_final)"""
        if self.role == "server":
            lo, hi = self.bounds[self.servers.index(comm.rank)]
            shard = Optimizer(server_rule or optimizer.transform,
                              {"shard": self.flat_params.buffer[lo:hi]})
            self.server = ShardServer(comm, shard, self.workers, self.staleness, self.timeline,
                                      self.roster, steps_per_push=n_push)
            """This server rank's shard server (servers only)."""
        elif self.servers:
            self.client = DownpourClient(self)
            """This worker rank's push and fetch side (workers only)."""
            if comm.rank != 0 and warm_start_steps:
                self._talk(self.client.wait_for_go, why="the others wait for its warm start")

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    **options: Any) -> Downpour:
        """Also: the evaluation is re-sharded when a worker dies (under ULFM)."""
        strategy = cls(optimizer, comm, **options)
        if workload is not None:  # built from a recipe (else around a bare optimizer)
            follow_shrinks(strategy.group, workload.reshard_evaluation)
            strategy.steps_per_epoch = workload.steps_per_epoch
        strategy._end_warm_start_with_the_first_epoch()
        return strategy

    def _end_warm_start_with_the_first_epoch(self) -> None:
        """A warm start longer than worker 0's first epoch would never end: at the epoch's end
        worker 0 waits in the workers' metrics allreduce for the others, which wait for its
        "go" (measured: ``mpiexec -n 3 meta run mnist_downpour --set train_samples=2048``,
        50 warm-start steps against 16 per epoch, hung). Worker 0 then sends it after its
        first epoch, and says so once."""
        if self.comm.rank != 0 or self.role == "server" or not self.servers:
            return
        if 0 < self.steps_per_epoch < self.warm_start_steps:
            print(f"meta: downpour: warm_start_steps={self.warm_start_steps} is more than "
                  f"worker 0's {self.steps_per_epoch} steps per epoch; the other workers start "
                  f"after its first epoch", file=sys.stderr, flush=True)
            self.warm_start_steps = self.steps_per_epoch

    def _talk(self, exchange: Any, *args: Any, why: str = "the run cannot go on without it"
              ) -> Any:
        """Run a worker's exchange with the servers; a dead server (or, during a warm start,
        worker 0, which sends the go) is a ``LostRankError`` naming it, not an MPI
        traceback."""
        try:
            return exchange(*args)
        except Exception as err:
            if not is_failure(err):
                raise
            raise lost_peer(self.comm, self.servers,
                            f"at step {self.client.steps} of worker {self.comm.rank}",
                            why) from err

    @property
    def source(self) -> int:
        return 0

    @classmethod
    def replica(cls, rank: int, size: int, servers: int = 1, **options: Any) -> tuple[int, int]:
        """Workers are ranks 0..size-servers-1 and take the data shards; servers train none."""
        workers = size - servers if size > 1 else 1
        return (rank, workers) if 0 <= rank < workers else (0, 1)

    def step(self, grads: Params) -> None:
        if self.left:
            raise RuntimeError(f"Downpour.step: worker {self.comm.rank} has left the run")
        if not self.servers:
            self.timeline.begin()
            self.optimizer.step(grads)
            self.timeline.lap("update")
            return
        self._talk(self.client.step, grads)

    def leave(self, planned_steps: int | None = None) -> None:
        """Stop training early: push what is accrued, tell the servers, and take part in no
        collective after this (``finish`` becomes a no-op). ``planned_steps``, the steps this
        worker was meant to run, goes into the servers' report of what was not trained."""
        if self.role != "worker":
            raise RuntimeError(f"Downpour.leave: rank {self.comm.rank} is a server")
        if self.servers and not self.left:
            self.lost = self._talk(self.client.leave,
                                   -1 if planned_steps is None else planned_steps)
        self.left = True

    def finish(self) -> None:
        if self.servers and not self.left:
            self.lost = self._talk(self.client.finish)
            if not self.lost:
                self._final()
            elif self.roster.died():  # the survivors shrink the world: every live rank joins
                survivors_comm(self.comm, [], died=True)

    def serve(self) -> None:
        if self.role != "server":
            super().serve()
        self.server.run()
        poll_all(self.comm, [self.group.iallreduce(self.roster.info, op="max")])
        if self.comm.rank == self.servers[0]:
            self._announce()
        self._final()

    def _announce(self) -> None:
        """The first server sends the verdict to every worker that has not left (a lost one
        may never read it, so that send is not waited for)."""
        sends = [(i, self.comm.isend(self.roster.info, w, VERDICT))
                 for i, w in enumerate(self.workers)
                 if self.roster.status(i) not in (LEFT, DIED)]
        poll_all(self.comm, [r for i, r in sends if self.roster.status(i) != LOST])

    def _final(self) -> None:
        """Collective over the survivors: every one gets every shard and the staleness
        counts; ``group`` becomes the surviving ranks of this rank's role."""
        survivors = self.roster.survivors(self.servers)
        sub = survivors_comm(self.comm, survivors, died=bool(self.roster.died()))
        self.end_comm = sub
        for root, (lo, hi) in zip(self.servers, self.bounds):
            sub.bcast(self.flat_params.buffer[lo:hi], root=survivors.index(root))
        self.staleness.merge(sub)
        self._gather_schedule(sub, survivors)
        if len(survivors) < self.comm.size:
            self.group = sub.split(int(self.role == "server"))

    def _gather_schedule(self, sub: Communicator, survivors: list[int]) -> None:
        """Rank 0 collects what the run's timing decided (one server's order of pushes and
        fetches, each worker's steps where a fetch landed early), so that
        ``meta.planner.virtual_time`` can recompute the run bit for bit; only for one server
        and every rank finished (``replay.json``'s ``schedule``)."""
        if self.n_servers != 1 or len(survivors) != self.comm.size or self.blocking_fetch:
            return  # the simulator follows the nonblocking client only: no schedule to replay
        mine = self.server.events if self.role == "server" else self.client.early
        got = sub.gather_obj(mine, root=0)
        if sub.rank == 0:
            self.schedule = {"n_fetch": self.n_fetch, "n_push": self.n_push,
                             "warm_start_steps": self.warm_start_steps,
                             "server": [list(e) for e in got[-1]],
                             "early": [list(e) for e in got[:-1]]}

    @property
    def update_order(self) -> list[int] | None:
        """The worker rank of each push the server applied (rank 0's, once finished)."""
        if self.schedule is None:
            return None
        return [self.workers[i] for i, tag, _ in self.schedule["server"] if tag == 0]

    def departures(self) -> list[str]:
        """One line per worker that left, was lost or died (known on the surviving ranks)."""
        return self.roster.departures(self.steps_per_epoch)

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update(self.staleness.metrics())
        if self.servers:
            out.update(self.roster.metrics(self.steps_per_epoch))
        return out

    def report_text(self) -> str:
        if not self.servers:
            return ""
        return "\n".join(["meta: " + line for line in self.departures()]
                         + [self.staleness.format()])

    def predict_comm_s(self, link: Link) -> float:
        """A worker's push plus fetch, averaged over the steps that carry them."""
        if not self.servers:
            return 0.0
        nbytes = self.flat_params.nbytes
        return link.message(nbytes) / self.n_push + link.message(nbytes) / self.n_fetch


class DownpourClient:
    """A worker's side of Algorithm 1.1: accrued gradients, nonblocking push and fetch."""

    def __init__(self, owner: Downpour) -> None:
        self.owner, self.comm, self.steps = owner, owner.comm, 0
        """``owner``: the Downpour strategy (its servers, shards, buffers). ``comm``: its
        communicator. ``steps``: local steps done."""
        self.accrued = np.zeros_like(owner.flat_grads.buffer)
        """Gradients summed since the last push."""
        self.outbox = np.zeros_like(self.accrued)
        """The push in flight: ``accrued`` copied out, left alone until its sends complete."""
        self.fetched = np.zeros_like(self.accrued)
        """Where the pending fetch's parameters land."""
        self.unpushed = np.zeros_like(self.accrued)
        """Local moves the servers have not seen: since the last push, and since the last push
        before the pending fetch was asked for (what its answer lacks)."""
        self.unfetched = np.zeros_like(self.accrued)
        """The local moves since the last push before the pending fetch was asked for: what its
        answer lacks, added to it when it lands."""
        self.moved = np.zeros_like(self.accrued)
        """Scratch: the parameters' move in this local step."""
        self.empty = np.empty(0, self.accrued.dtype)
        """A zero-length array: the payload of control messages (FETCH, GO)."""
        self.pushes: list = []
        """The pending push's send requests, one per server."""
        self.fetches: list = []
        """The pending fetch's requests (receives of the shards and the FETCH sends); empty: none
        pending."""
        self.started = False
        """the step-0 fetch has landed"""
        self.verdict = None
        """the receive of the servers' verdict, once posted"""
        self.judged = False
        """the verdict came while this worker was still training: lost"""
        self.early: list[int] = []
        """steps whose pending fetch landed before the local step"""

    def shards(self, buffer: np.ndarray) -> list[tuple[int, np.ndarray]]:
        return [(s, buffer[lo:hi]) for s, (lo, hi) in zip(self.owner.servers, self.owner.bounds)]

    def step(self, grads: Params) -> None:
        owner, t = self.owner, self.owner.timeline
        t.begin()
        if not self.started:
            self.fetch_now()
            t.lap("communicate")
        self.accrued += owner.flat_grads.pack(grads)
        t.lap("pack")
        if self.fetches and test_all(self.comm, self.fetches):
            self.land_fetch()
            self.early.append(self.steps)
        params = owner.flat_params.buffer
        np.copyto(self.moved, params)
        owner.optimizer.step(owner.flat_grads.views)  # the local step between fetches
        np.subtract(params, self.moved, out=self.moved)
        self.unpushed += self.moved
        if self.fetches:
            self.unfetched += self.moved
        t.lap("update")
        self.steps += 1
        if self.steps % owner.n_push == 0:
            self.push()
        if self.steps % owner.n_fetch == 0 and owner.blocking_fetch:
            self.fetch_now()  # the answer holds this push: the next gradient is one fetch fresher
        elif self.steps % owner.n_fetch == 0:
            if self.fetches:
                self.await_fetch()
            if not self.fetches:
                self.start_fetch()
        if self.comm.rank == 0 and self.steps == owner.warm_start_steps:
            self.fetch_now()
            for worker in owner.workers[1:]:
                self.comm.send(self.empty, worker, GO)
        t.lap("communicate")

    def push(self) -> None:
        poll_all(self.comm, self.pushes)  # the outbox is free again
        np.copyto(self.outbox, self.accrued)
        self.accrued[:] = 0
        self.unpushed[:] = 0
        self.pushes = [self.comm.isend(part, s, PUSH) for s, part in self.shards(self.outbox)]
        self.owner.bytes_sent += self.outbox.nbytes

    def start_fetch(self) -> None:
        self.fetches = [self.comm.irecv(part, s, PARAMS) for s, part in self.shards(self.fetched)]
        self.fetches += [self.comm.isend(self.empty, s, FETCH) for s in self.owner.servers]
        np.copyto(self.unfetched, self.unpushed)

    def land_fetch(self) -> None:
        """Take the fetched values, plus the local moves they cannot contain.

        A server answers FETCH after every push sent before it and before every push sent
        after it, so the answer lacks this worker's own moves from the last push before the
        request on. Those pushes reach the servers anyway; copying the answer as is would undo
        the moves here, and the worker would walk the same way again and push it twice. On a
        loaded machine an answer can land tens of steps after the request.
        """
        np.add(self.fetched, self.unfetched, out=self.owner.flat_params.buffer)
        self.fetches = []

    def await_fetch(self) -> bool:
        """Wait for the pending fetch and land it; False (it stays pending) once the servers
        have declared this worker lost.

        A fetch is due every ``n_fetch`` steps; one still out then is waited for, not skipped.
        Skipping let workers run on from one old answer while a server was off the CPU (a
        scheduler slice on oversubscribed cores is tens of steps): each walked the same way
        alone, and the servers summed the walks, overshooting. Only a lost worker's request
        goes unanswered, and for it the verdict comes instead (sent once every other worker
        is done), so with ``worker_timeout_s`` the wait listens for that too.
        """
        roster = self.owner.roster
        if roster.timeout_s is not None and self.verdict is None:
            self.verdict = self.comm.irecv(roster.info, self.owner.servers[0], VERDICT)

        def answered() -> bool:  # the fetch, or else the verdict
            if self.judged or test_all(self.comm, self.fetches):
                return True
            self.judged = self.verdict is not None and test_all(self.comm, [self.verdict])
            return False

        poll_until(answered)
        if self.judged:
            return False
        self.land_fetch()
        return True

    def fetch_now(self) -> None:
        """Fetch and wait: the servers answer in order, so every earlier push is applied.

        Algorithm 1.1 fetches at step 0 too, and the first step waits for that answer: a worker
        must not train before the servers serve. The initial broadcast does not hold it back
        (its root returns at once), and under ``mpiexec`` a server can come up tens of ms
        after the workers: each worker then ran its whole share alone from the initial values,
        and the servers, summing every worker's pushes, moved as far again past the optimum
        (least squares, 2 workers: the final loss equal to the initial one).
        """
        if self.fetches:
            self.await_fetch()
        if not self.judged:
            self.start_fetch()
            self.await_fetch()
        self.started = True

    def wait_for_go(self) -> None:
        poll_all(self.comm, [self.comm.irecv(self.empty, 0, GO)])
        self.fetch_now()

    def leave(self, planned_steps: int) -> bool:
        """Push what is accrued, drain the pipes, and send every server EXIT (steps, planned).
        Returns True, sending nothing more, when the servers had already declared this worker
        lost: they no longer answer its fetch, so the drain listens for their verdict too (it
        used to wait for that fetch forever); the fetch is cancelled, the pushes left to MPI."""
        if self.steps % self.owner.n_push:
            self.push()
        roster = self.owner.roster
        if roster.timeout_s is not None and self.verdict is None:
            self.verdict = self.comm.irecv(roster.info, self.owner.servers[0], VERDICT)
        lost: list[bool] = []

        def drained() -> bool:  # every fetch and push, or else the verdict
            if test_all(self.comm, self.fetches + self.pushes):
                return True
            if self.verdict is not None and test_all(self.comm, [self.verdict]):
                lost.append(True)
            return bool(lost)

        poll_until(drained)
        if lost:
            cancel_all(self.comm, self.fetches[: len(self.owner.servers)])  # the receives
            return True
        self.fetches, self.pushes = [], []
        cancel_all(self.comm, [self.verdict])  # no verdict is sent to a worker that left
        note = np.array([self.steps, planned_steps], self.accrued.dtype)
        poll_all(self.comm, [self.comm.isend(note, s, EXIT) for s in self.owner.servers])
        return False

    def finish(self) -> bool:
        """Push what is accrued, tell every server this worker is done, and wait for the
        verdict; True when the servers declared this worker lost (then nothing is waited for:
        a pending fetch is cancelled, pushes and DONE are left to MPI)."""
        if self.steps % self.owner.n_push:
            self.push()
        done = [self.comm.isend(self.empty, s, DONE) for s in self.owner.servers]
        roster = self.owner.roster
        if self.verdict is None:
            self.verdict = self.comm.irecv(roster.info, self.owner.servers[0], VERDICT)
        poll_all(self.comm, [self.verdict])
        if roster.status(self.owner.workers.index(self.comm.rank)) == LOST:
            cancel_all(self.comm, self.fetches[: len(self.owner.servers)])  # the receives
            return True
        poll_all(self.comm, self.fetches + self.pushes + done)
        return False
