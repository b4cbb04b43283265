"""One shard of Downpour's parameter server (seed 001, DistBelief's sharded parameter server).

A ``ShardServer`` keeps one posted receive per worker (any tag, so a worker's messages are
handled in the order it sent them) and polls them: a PUSH of accrued gradients is applied with
the shard's Level 2 optimizer, a FETCH is answered with the shard's current values, DONE retires
the worker. ``StalenessLog`` records, per applied push, the server's update count at apply
minus the count it had when it last answered that worker's fetch.
"""

from __future__ import annotations

import numpy as np

from meta.lv2.optimizers import Optimizer
from meta.lv3.communicator import Communicator
from meta.lv3.polling import poll_all, poll_any
from meta.lv3.timeline import Timeline

PUSH, FETCH, PARAMS, DONE, GO = 31, 32, 33, 34, 35  # message tags
MAX_STALENESS = 64  # the histogram's last bin counts this and more


class StalenessLog:
    """Staleness histogram and pushes per worker; ``merge`` sums them over ranks (collective)."""

    def __init__(self, workers: int) -> None:
        self.counts = np.zeros(MAX_STALENESS + 1, dtype=np.int64)
        self.pushes = np.zeros(max(workers, 1), dtype=np.int64)
        self.order: list[int] = []  # the worker of each applied push, on this server

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


class ShardServer:
    """Serve one shard until every worker has sent DONE."""

    def __init__(self, comm: Communicator, shard: Optimizer, workers: list[int],
                 log: StalenessLog, timeline: Timeline) -> None:
        self.comm, self.shard, self.workers, self.log, self.timeline = (
            comm, shard, workers, log, timeline)
        self.values = shard.params["shard"]
        self.updates = 0  # pushes applied so far: the shard's version
        self.answered = [0] * len(workers)  # version sent with each worker's last fetch

    def run(self) -> None:
        comm, t = self.comm, self.timeline
        inboxes = [np.empty_like(self.values) for _ in self.workers]
        outboxes = [np.empty_like(self.values) for _ in self.workers]
        receives = [comm.irecv(box, w) for box, w in zip(inboxes, self.workers)]
        sends: list = [None] * len(self.workers)
        active = len(self.workers)
        while active:
            t.begin()
            i, tag = poll_any(comm, receives)
            t.lap("communicate")
            if tag == DONE:
                active -= 1
                continue
            if tag == PUSH:
                self.log.record(i, self.updates - self.answered[i])
                self.shard.step({"shard": inboxes[i]})
                self.updates += 1
                t.lap("update")
            elif tag == FETCH:
                poll_all(comm, [sends[i]])  # the previous answer has left the outbox
                np.copyto(outboxes[i], self.values)
                sends[i] = comm.isend(outboxes[i], self.workers[i], PARAMS)
                self.answered[i] = self.updates
                t.lap("pack")
            else:
                raise ValueError(f"ShardServer: unexpected tag {tag} from rank {self.workers[i]}")
            receives[i] = comm.irecv(inboxes[i], self.workers[i])
        poll_all(comm, sends)
