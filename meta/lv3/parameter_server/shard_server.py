"""One shard of Downpour's parameter server (seed 001, DistBelief's sharded parameter server).

A ``ShardServer`` keeps one posted receive per worker (any tag, so a worker's messages are
handled in the order it sent them) and polls them: a PUSH of accrued gradients is applied with
the shard's Level 2 optimizer, a FETCH is answered with the shard's current values, DONE retires
the worker. ``StalenessLog`` records, per applied push, the server's update count at apply
minus the count it had when it last answered that worker's fetch.

Workers may drop out (the seed: "the wholesale failure [of a replica] may be taken offline"):
EXIT (payload: steps done, steps planned) retires a worker that leaves early, and with a
``timeout_s`` a worker silent for that long is declared LOST: its receive is cancelled and its
later messages are ignored. A worker whose process dies (under an MPI with ULFM:
``meta.lv3.comm.survival``) is DIED: the servers see it as an error on its receive, drop it and
record when, after how many steps and with how many of its pushes applied. ``Roster`` keeps
what the servers know of each worker.
"""

from __future__ import annotations

import sys
import time
from typing import Sequence

import numpy as np

from meta.lv2.optimizers import GradientTransformation, Optimizer
from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import cancel_all, poll_all, poll_any_until
from meta.lv3.comm.survival import RESTART_HINT, LostRankError, failed_ranks, is_failure, lost
from meta.lv3.timeline import Timeline

PUSH, FETCH, PARAMS, DONE, GO, EXIT, VERDICT = tags.SHARD_SERVER  # message tags
RUNNING, FINISHED, LEFT, LOST, DIED = 0, 1, 2, 3, 4  # a worker's status (max wins)
MAX_STALENESS = 64  # the histogram's last bin counts this and more


def say_if_rule_is_split(strategy: str, rule: GradientTransformation, pieces: int,
                         speaks: bool) -> None:
    """One line on stderr (where ``speaks``) when ``pieces`` servers' slices each apply a rule
    that is not elementwise (a clip by global norm, a trust ratio) to their own slice: the
    asynchronous shards never meet, so its norm is the slice's, not the whole model's as on
    one process. Never silently: the user learns it before training, and how to avoid it."""
    if pieces > 1 and speaks and not rule.elementwise:
        print(f"meta: {strategy}: the update rule is not elementwise (a clip by global norm?): "
              f"each of the {pieces} server slices applies it to its own values alone, not to "
              f"the whole model's as one process would; one server (and one stage) keeps it "
              f"whole", file=sys.stderr, flush=True)


class StalenessLog:
    """Staleness histogram and pushes per worker; ``merge`` sums them over ranks (collective)."""

    def __init__(self, workers: int) -> None:
        self.counts = np.zeros(MAX_STALENESS + 1, dtype=np.int64)
        """How many pushes were applied at each staleness (updates since the pusher's last
        fetch), the last bin for ``MAX_STALENESS`` and more."""
        self.pushes = np.zeros(max(workers, 1), dtype=np.int64)
        """Pushes applied per worker."""
        self.order: list[int] = []
        """the worker of each applied push, on this server"""

    def record(self, worker: int, staleness: int) -> None:
        if staleness < 0:
            raise AssertionError(f"StalenessLog: negative staleness {staleness} from worker "
                                 f"{worker}")
        self.counts[min(staleness, MAX_STALENESS)] += 1
        self.pushes[worker] += 1
        self.order.append(worker)

    def merge(self, comm: Communicator) -> None:
        """Every rank ends with the sums over all servers (workers contribute zeros)."""
        comm.allreduce(self.counts)
        comm.allreduce(self.pushes)

    def metrics(self) -> dict[str, float]:
        total = int(self.counts.sum())
        if not total:
            return {}
        values = np.arange(len(self.counts))
        out = {"staleness_mean": float(values @ self.counts / total),
               "staleness_max": float(values[self.counts > 0].max()),
               "pushes_applied": float(total)}
        out.update({f"staleness_count_{k}": float(c) for k, c in enumerate(self.counts) if c})
        out.update({f"pushes_from_worker_{w}": float(c) for w, c in enumerate(self.pushes)})
        return out

    def format(self) -> str:
        """The histogram as text, in bins 0, 1, 2-3, 4-7, ... (the counts stay exact)."""
        total = max(int(self.counts.sum()), 1)
        lines = ["meta: staleness of applied pushes (server updates since the worker's fetch)"]
        lo = 0
        while lo < len(self.counts):
            hi = max(lo, 2 * lo - 1) if lo > 1 else lo
            c = int(self.counts[lo : hi + 1].sum())
            label = str(lo) if hi == lo else f"{lo}-{hi}" if hi < MAX_STALENESS else f">={lo}"
            lines.append(f"  {label:>6} {c:>7} {'#' * round(40 * c / total)}")
            lo = hi + 1
        return "\n".join(lines)


class Roster:
    """Per worker: status, steps done and planned (from EXIT), pushes applied, seconds silent,
    and for one that died, how many seconds into serving its death was seen.

    One float64 row per worker, so the servers agree with one ``allreduce(max)`` (LOST beats
    FINISHED: a worker one server gave up on is lost to all; DIED beats all) and send it to
    the workers as is.
    """

    STATUS, STEPS, PLANNED, PUSHES, SILENT, AT = range(6)
    """The columns of a worker's row in ``info``: status, steps done, steps planned, pushes
    applied, seconds silent, and when its death was seen."""

    def __init__(self, workers: list[int], timeout_s: float | None = None) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        """``workers``: the workers' ranks. ``timeout_s``: seconds of silence after which a
        worker is declared lost; None: never."""
        self.info = np.zeros((max(len(workers), 1), 6))
        """One float64 row per worker, columns ``STATUS`` to ``AT``: what ``allreduce(max)``
        merges over the servers."""
        self.info[:, self.PLANNED] = -1

    def status(self, worker: int) -> int:
        return int(self.info[worker, self.STATUS])

    def mark(self, worker: int, status: int, **fields: float) -> None:
        self.info[worker, self.STATUS] = status
        for name, value in fields.items():
            self.info[worker, getattr(self, name.upper())] = value

    def survivors(self, servers: list[int]) -> list[int]:
        """Ranks that take part in the end of the run: finished workers and the servers."""
        alive = [w for i, w in enumerate(self.workers) if self.status(i) in (RUNNING, FINISHED)]
        return sorted(alive + servers)

    def died(self) -> list[int]:
        """Indices of the workers whose process died."""
        return [i for i in range(len(self.workers)) if self.status(i) == DIED]

    def departures(self, steps_per_epoch: int = 0) -> list[str]:
        """What was lost, one line per worker that left, was lost or died (with
        ``steps_per_epoch``, the epoch it died in)."""
        lines = []
        for i, row in enumerate(self.info):
            steps, planned, pushes = int(row[self.STEPS]), int(row[self.PLANNED]), int(
                row[self.PUSHES])
            if self.status(i) == LEFT and planned > steps:
                lines.append(f"worker {i} left after {steps} of {planned} steps; its remaining "
                             f"{planned - steps} steps on its shard of data were not trained")
            elif self.status(i) == LEFT:
                lines.append(f"worker {i} left after {steps} steps; the rest of its shard of "
                             "data was not trained")
            elif self.status(i) == LOST:
                lines.append(f"worker {i} lost: silent for {row[self.SILENT]:.2f} s (timeout "
                             f"{self.timeout_s} s) after {pushes} applied pushes; the rest of "
                             "its shard of data was not trained, later pushes were ignored")
            elif self.status(i) == DIED:
                epoch = f" (epoch {steps // steps_per_epoch + 1})" if steps_per_epoch else ""
                lines.append(f"lost worker rank {self.workers[i]}: its process died after "
                             f"{steps} steps{epoch}, {row[self.AT]:.1f} s into training; "
                             f"{pushes} of its updates were applied; the other workers "
                             "trained on without the rest of its shard of data")
        return lines

    def metrics(self, steps_per_epoch: int = 0) -> dict[str, float]:
        status = self.info[:, self.STATUS]
        out = {"workers_left": float((status == LEFT).sum()),
               "workers_lost": float((status == LOST).sum())}
        return {**out, **self.death_metrics(steps_per_epoch)}

    def death_metrics(self, steps_per_epoch: int = 0) -> dict[str, float]:
        """When workers died: ``workers_died`` and, per dead worker's rank r,
        ``lost_rank_<r>_step`` (steps it finished), ``_epoch``, ``_after_s`` (into training)
        and ``_updates_applied``. Nothing when none died."""
        out = {"workers_died": float(len(self.died()))} if self.died() else {}
        for i in self.died():
            row, key = self.info[i], f"lost_rank_{self.workers[i]}_"
            out[key + "step"] = float(row[self.STEPS])
            if steps_per_epoch:
                out[key + "epoch"] = float(row[self.STEPS] // steps_per_epoch + 1)
            out[key + "after_s"] = float(row[self.AT])
            out[key + "updates_applied"] = float(row[self.PUSHES])
        return out

    def drop_dead(self, error: Exception, comm: Communicator, active: set[int],
                  requests: list[list], applied: Sequence[float], started: float,
                  steps_per_update: int = 1) -> None:
        """After ``error`` (MPI's report of a dead process) on this server: mark the active
        workers that died DIED, with ``applied[i]`` of their updates applied (each one
        ``steps_per_update`` steps), stop listening to them (their entries in each list of
        ``requests`` are dropped) and take them out of ``active``. Raises ``LostRankError``
        when a rank that is not a worker died (a server) or no worker is left, and ``error``
        when no active worker died (then it was not about one)."""
        if not is_failure(error):
            raise error
        dead, now, null = failed_ranks(comm), time.monotonic(), comm.null_request()
        for rank in dead:
            if rank not in self.workers:
                raise lost(rank, comm.size, "server",
                           f"after {now - started:.1f} s of training (seen by server rank "
                           f"{comm.rank})")
        gone = [i for i in sorted(active) if self.workers[i] in dead]
        if not gone:
            raise error
        for i in gone:
            self.mark(i, DIED, steps=applied[i] * steps_per_update, pushes=applied[i],
                      at=now - started)
            active.discard(i)
            for each in requests:
                each[i] = null if each[i] is not None else None
        if len(self.died()) == len(self.workers):
            raise LostRankError(f"every worker of the run died (ranks "
                                f"{', '.join(map(str, self.workers))}), the last after "
                                f"{now - started:.1f} s of training; {RESTART_HINT}")


class ShardServer:
    """Serve one shard until every worker has sent DONE or EXIT, or (with ``roster.timeout_s``)
    stayed silent past the timeout. ``arrivals`` holds (worker, monotonic time) per push."""

    def __init__(self, comm: Communicator, shard: Optimizer, workers: list[int],
                 log: StalenessLog, timeline: Timeline, roster: Roster | None = None,
                 steps_per_push: int = 1) -> None:
        self.comm, self.shard, self.workers, self.log, self.timeline = (
            comm, shard, workers, log, timeline)
        """``comm``: every rank. ``shard``: the optimizer over this server's shard. ``workers``:
        the ranks that push. ``log``: the staleness log. ``timeline``: this rank's timeline."""
        self.steps_per_push = steps_per_push
        """a dead worker's steps: its pushes times this"""
        self.roster = Roster(workers) if roster is None else roster
        """Per worker: status, steps, pushes and silence."""
        self.values = shard.params["shard"]
        """The shard's current values (what a fetch gets)."""
        self.updates = 0
        """pushes applied so far: the shard's version"""
        self.answered = [0] * len(workers)
        """version sent with each worker's last fetch"""
        self.arrivals: list[tuple[int, float]] = []
        """(worker, monotonic time) per push applied."""
        self.events: list[tuple[int, int, float]] = []
        """(worker index, 0 for a push or 1 for a fetch, seconds into serving) of every message
        handled, in order: with the workers' landing steps, what a virtual-time replay needs
        to end with this run's weights bit for bit (meta.planner.virtual_time)"""

    def _deadline(self, active: set[int], last: list[float]) -> float:
        timeout = self.roster.timeout_s
        return float("inf") if timeout is None else min(last[i] for i in active) + timeout

    def _drop_silent(self, active: set[int], last: list[float], receives: list) -> None:
        """Declare lost every worker silent past the timeout, and stop listening to it."""
        now = time.monotonic()
        for i in sorted(active):
            if now - last[i] >= self.roster.timeout_s:
                self.roster.mark(i, LOST, silent=now - last[i])
                cancel_all(self.comm, [receives[i]])
                active.discard(i)

    def run(self) -> None:
        comm, t, n = self.comm, self.timeline, self.values.size
        # Two values at least: an EXIT carries (steps done, steps planned).
        inboxes = [np.empty(max(n, 2), self.values.dtype) for _ in self.workers]
        outboxes = [np.empty_like(self.values) for _ in self.workers]
        receives = [comm.irecv(box, w) for box, w in zip(inboxes, self.workers)]
        sends: list = [None] * len(self.workers)
        active = set(range(len(self.workers)))
        last = [time.monotonic()] * len(self.workers)
        started = last[0]
        while active:
            t.begin()
            try:
                got = poll_any_until(comm, receives, self._deadline(active, last))
            except Exception as err:  # a worker died (under ULFM): go on without it
                self.roster.drop_dead(err, comm, active, [receives, sends], self.log.pushes,
                                      started, self.steps_per_push)
                continue
            t.lap("communicate")
            if got is None:
                self._drop_silent(active, last, receives)
                continue
            i, tag = got
            last[i] = time.monotonic()
            if tag in (DONE, EXIT):
                steps, planned = inboxes[i][:2] if tag == EXIT else (0, -1)
                self.roster.mark(i, FINISHED if tag == DONE else LEFT, steps=steps,
                                 planned=planned)
                active.discard(i)
                continue
            if tag == PUSH:
                self.log.record(i, self.updates - self.answered[i])
                self.shard.step({"shard": inboxes[i][:n].reshape(self.values.shape)})
                self.updates += 1
                self.arrivals.append((i, last[i]))
                self.events.append((i, 0, last[i] - started))
                t.lap("update")
            elif tag == FETCH:
                poll_all(comm, [sends[i]])  # the previous answer has left the outbox
                np.copyto(outboxes[i], self.values)
                sends[i] = comm.isend(outboxes[i], self.workers[i], PARAMS)
                self.answered[i] = self.updates
                self.events.append((i, 1, last[i] - started))
                t.lap("pack")
            else:
                raise ValueError(f"ShardServer: unexpected tag {tag} from rank {self.workers[i]}")
            receives[i] = comm.irecv(inboxes[i], self.workers[i])
        for i in range(len(self.workers)):
            self.roster.mark(i, self.roster.status(i), pushes=self.log.pushes[i])
        # An answer to a lost worker may never be received: it is not waited for.
        poll_all(comm, [s for i, s in enumerate(sends) if self.roster.status(i) < LOST])
