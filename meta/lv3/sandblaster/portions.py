"""Sandblaster's portions: the coordinator's dispatcher that hands out pieces of each
evaluation to idle workers (with backups near the end, first result wins), its statistics,
and the worker loop."""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from meta.lv3.comm.polling import cancel_all, poll_all, poll_any
from meta.lv3.sandblaster.shards import (
    FETCH,
    PARAMS,
    PUSH,
    RESULT,
    RESULT_FIELDS,
    ROWS,
    STOP,
    TASK,
    _wait_any,
)

if TYPE_CHECKING:
    from meta.lv3.sandblaster.strategy import Sandblaster


class PortionStats:
    """What the coordinator saw: per worker portions counted and results discarded, backups,
    evaluation (batch) times."""

    def __init__(self, workers: int) -> None:
        self.completed = np.zeros(workers, dtype=np.int64)
        """results counted"""
        self.discarded = np.zeros(workers, dtype=np.int64)
        """duplicates, stale, skipped"""
        self.backups_issued = self.backups_won = 0
        """``backups_issued``: portions handed to a second worker near the end of an evaluation.
        ``backups_won``: of those, how many the backup finished first."""
        self.batch_times: list[float] = []
        """seconds per evaluation"""

    def metrics(self) -> dict[str, float]:
        out = {f"portions_worker_{w}": float(c) for w, c in enumerate(self.completed)}
        out.update({f"discarded_worker_{w}": float(c) for w, c in enumerate(self.discarded)})
        out.update(backups_issued=float(self.backups_issued),
                   backups_won=float(self.backups_won),
                   evaluations=float(len(self.batch_times)))
        if self.batch_times:
            out["batch_time_median_s"] = float(np.median(self.batch_times))
        return out

    def format(self) -> str:
        lines = ["meta: sandblaster portions per worker (counted / discarded copies)"]
        lines += [f"  worker {w}: {c} / {d}"
                  for w, (c, d) in enumerate(zip(self.completed, self.discarded))]
        median = np.median(self.batch_times) if self.batch_times else float("nan")
        lines.append(f"meta: {len(self.batch_times)} evaluations, median {median * 1e3:.1f} ms; "
                     f"backups issued {self.backups_issued}, won {self.backups_won}")
        return "\n".join(lines)


class Dispatcher:
    """Hands the portions of one evaluation to idle workers, with backups near the end."""

    def __init__(self, owner: Sandblaster) -> None:
        self.owner, self.comm = owner, owner.comm
        """``owner``: the Sandblaster strategy. ``comm``: its communicator."""
        self.workers = owner.workers
        """The workers' ranks."""
        self.results = [np.empty(RESULT_FIELDS) for _ in self.workers]
        """Per worker: the box its next result (loss, rows, correct, ...) lands in."""
        self.receives = [self.comm.irecv(box, w, RESULT)
                         for box, w in zip(self.results, self.workers)]
        """Per worker: the receive of its next result."""
        self.tasks = [np.empty(4, dtype=np.int64) for _ in self.workers]
        """Per worker: the task message (evaluation, portion, rows) last sent to it."""
        self.task_sends: list[Any] = [None] * len(self.workers)
        """Per worker: the send of its task, or None."""
        self.busy: list[tuple[int, int] | None] = [None] * len(self.workers)
        """Per worker: the (evaluation, portion) it is working on, or None when idle."""
        self.rows = np.empty(0, dtype=np.int64)
        """The batch's rows, after their count, as sent to the workers."""
        self.rows_sends: list[Any] = []
        """The sends of the batch's rows."""
        self.evaluation = 0
        """The current evaluation's number."""
        self.stats = PortionStats(len(self.workers))
        """What the coordinator saw: portions counted and discarded, backups, evaluation times."""

    def send_rows(self, rows: np.ndarray) -> None:
        poll_all(self.comm, self.rows_sends)
        self.rows = np.concatenate([[len(rows)], rows]).astype(np.int64)
        self.rows_sends = [self.comm.isend(self.rows, w, ROWS) for w in self.workers]

    def _assign(self, i: int, e: int, p: int, lo: int, hi: int) -> None:
        poll_all(self.comm, [self.task_sends[i]])
        self.tasks[i][:] = (e, p, lo, hi)
        self.task_sends[i] = self.comm.isend(self.tasks[i], self.workers[i], TASK)
        self.busy[i] = (e, p)

    def run(self, e: int, rows: int, portions: int) -> tuple[float, int]:
        """Evaluate the batch (already sent) in ``portions`` pieces: (loss sum, correct)."""
        edges = np.linspace(0, rows, portions + 1).astype(int)
        pending = deque(range(portions))
        copies: dict[int, list[int]] = {p: [] for p in range(portions)}
        backups: set[tuple[int, int]] = set()  # (portion, worker) of backup copies
        done: set[int] = set()
        loss_sum, correct = 0.0, 0
        start = time.perf_counter()
        while len(done) < portions:
            for i, task in enumerate(self.busy):
                if task is not None:
                    continue
                if pending:
                    p = pending.popleft()
                elif self.owner.backups:
                    # The unfinished portion with the fewest copies, earliest first.
                    open_ = [q for q in range(portions) if q not in done and copies[q]
                             and i not in copies[q] and len(copies[q]) <= self.owner.backups]
                    if not open_:
                        continue
                    p = min(open_, key=lambda q: len(copies[q]))
                    backups.add((p, i))
                    self.stats.backups_issued += 1
                else:
                    break
                copies[p].append(i)
                self._assign(i, e, p, int(edges[p]), int(edges[p + 1]))
            i = _wait_any(self.comm, self.receives, self.owner.local.poll)
            r = self.results[i]
            self.busy[i] = None
            re, p, skipped = int(r[0]), int(r[1]), bool(r[6])
            if re != e or skipped or p in done:  # stale, or the first copy already won
                self.stats.discarded[i] += 1
            else:
                done.add(p)
                loss_sum += r[2]
                correct += int(r[3])
                self.stats.completed[i] += 1
                self.stats.backups_won += (p, i) in backups
            if re == e and i in copies[p]:
                copies[p].remove(i)
            self.receives[i] = self.comm.irecv(self.results[i], self.workers[i], RESULT)
        self.stats.batch_times.append(time.perf_counter() - start)
        return loss_sum, correct

    def drain(self) -> None:
        """Wait for the results still out (stale copies), then stop the workers."""
        while any(task is not None for task in self.busy):
            i = _wait_any(self.comm, self.receives, self.owner.local.poll)
            self.busy[i] = None
            self.stats.discarded[i] += 1
            self.receives[i] = self.comm.irecv(self.results[i], self.workers[i], RESULT)
        cancel_all(self.comm, self.receives)
        poll_all(self.comm, self.task_sends + self.rows_sends)
        stop = np.zeros(1, dtype=np.int64)
        poll_all(self.comm, [self.comm.isend(stop, w, STOP) for w in self.workers])


class PortionWorker:
    """A worker: fetch the evaluation's point, evaluate the portion's rows, push the gradient
    slices to the shards, report the loss to the coordinator; until STOP."""

    def __init__(self, owner: Sandblaster) -> None:
        self.owner, self.comm = owner, owner.comm
        """``owner``: the Sandblaster strategy. ``comm``: its communicator."""
        if owner.evaluate is None:
            raise ValueError(f"Sandblaster: worker rank {owner.comm.rank} has no rows "
                             "evaluator (pass evaluate=...)")
        self.evaluate = owner.evaluate
        """The rows evaluator: loss, gradient and correct count of given rows at a point."""
        self.inbox = np.empty(owner.evaluate.examples + 1, dtype=np.int64)
        """Where the batch's rows (after their count) land."""
        self.rows = np.empty(0, dtype=np.int64)
        """The current batch's rows."""
        self.fetched = -1
        """the evaluation whose point is in the parameters"""
        n = len(owner.flat_params)
        self.point = np.empty(n)
        """The evaluation's point (the parameters), assembled from the shards."""
        self.param_boxes = [np.empty(1 + hi - lo) for lo, hi in owner.bounds]
        """Per shard: the box its slice of the point lands in (after the evaluation's number)."""
        self.push_boxes = [np.empty(2 + hi - lo) for lo, hi in owner.bounds]
        """Per shard: the box a portion's gradient slice is pushed from."""
        self.result = np.empty(RESULT_FIELDS)
        """The result reported to the coordinator."""
        self.slow = owner.slowdown if owner.comm.rank == owner.slow_rank else 1.0
        """How many times slower this worker pretends to be (the ``slow_worker`` test option); 1:
        as it is."""

    def run(self) -> None:
        coordinator = self.owner.coordinator
        while True:
            _, tag = poll_any(self.comm, [self.comm.irecv(self.inbox, coordinator)])
            if tag == STOP:
                return
            if tag == ROWS:
                self.rows = self.inbox[1 : 1 + self.inbox[0]].copy()
            elif tag == TASK:
                self.portion(*(int(v) for v in self.inbox[:4]))
            else:
                raise ValueError(f"Sandblaster worker {self.comm.rank}: unexpected tag {tag}")

    def fetch(self, e: int) -> bool:
        """The point of evaluation ``e`` into the parameters; False when it has ended."""
        owner = self.owner
        waits = [self.comm.irecv(box, s, PARAMS) for box, s in zip(self.param_boxes,
                                                                     owner.shard_ranks)]
        ask = np.array([float(e)])
        poll_all(self.comm, waits + [self.comm.isend(ask, s, FETCH) for s in owner.shard_ranks])
        if any(int(box[0]) != e for box in self.param_boxes):
            return False
        for box, (lo, hi) in zip(self.param_boxes, owner.bounds):
            self.point[lo:hi] = box[1:]
        owner.flat_params.buffer[...] = self.point
        self.fetched = e
        owner.bytes_sent += ask.nbytes * len(owner.shard_ranks)
        return True

    def portion(self, e: int, p: int, lo: int, hi: int) -> None:
        owner = self.owner
        ok = self.fetched == e or self.fetch(e)
        self.result[:] = (e, p, 0.0, 0.0, hi - lo, 0.0, float(not ok))
        if ok:
            start = time.perf_counter()
            loss_sum, grads, correct = self.evaluate(self.rows[lo:hi])
            seconds = time.perf_counter() - start
            if self.slow > 1:
                time.sleep((self.slow - 1) * seconds)
            flat = owner.flat_grads.pack(grads)
            for box, (a, b) in zip(self.push_boxes, owner.bounds):
                box[:2] = (e, p)
                box[2:] = flat[a:b]
            pushes = [self.comm.isend(box, s, PUSH)
                      for box, s in zip(self.push_boxes, owner.shard_ranks)]
            poll_all(self.comm, pushes)  # pushed before reported: see Sandblaster.finish
            owner.bytes_sent += sum(box.nbytes for box in self.push_boxes)
            self.result[2:6] = (loss_sum, correct, hi - lo, seconds)
        poll_all(self.comm, [self.comm.isend(self.result, owner.coordinator, RESULT)])
