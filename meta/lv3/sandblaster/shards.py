"""Sandblaster's shards: the parameters, gradients and (s, y) history in slices, and the
vector commands (copy, axpy, scale, subtract, dots, norms) the coordinator sends them; the
message tags and command codes of the whole protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.polling import cancel_all, poll, poll_all, poll_until

# Message tags (comm/tags.py).
CMD, REPLY, ROWS, TASK, RESULT, PUSH, FETCH, PARAMS, STOP, GATHERED = tags.SANDBLASTER
# Vector commands, one row [op, a, b, c, value] each; a, b, c are slot numbers.
COPY, AXPY, SCALE, SUB, DOT, NORMS, BEGIN, SEAL, GATHER, QUIT = range(10)
WIDTH = 5  # floats per command row
MAX_COMMANDS = 256  # rows per command message (two_loop's first dots: history + 1)
X_SLOT = 0  # where every shard keeps its slice of the initial parameters
# A RESULT: evaluation, portion, loss sum, correct, rows, compute seconds, skipped (stale point)
RESULT_FIELDS = 7


def _wait_any(comm: Communicator, requests: list[Any], idle: Callable[[], bool]) -> int:
    """Index of a completed request of ``requests``; ``idle()`` (true when it did some work)
    runs between tests, and the loop sleeps when it did none (see ``meta.lv3.comm.polling``)."""
    hit = poll(comm, requests, "any", idle=idle)
    assert hit is not None  # no deadline
    return hit[0]


class VectorShard:
    """One shard: slices of every vector (by slot), and the worker side of evaluations.

    ``execute`` runs command rows and returns the answers of the reductions; ``poll``
    handles workers' pushes (a portion's gradient slice, added once) and fetches (the current
    evaluation's point; one for an evaluation not begun yet waits, one for an ended one is
    answered with the current evaluation's number, so the worker skips the stale portion).
    """

    def __init__(self, comm: Communicator, bounds: tuple[int, int], x0: np.ndarray,
                 workers: list[int]) -> None:
        self.comm, self.workers = comm, workers
        """``comm``: every rank. ``workers``: the workers' ranks that push and fetch."""
        self.lo, self.hi = bounds
        """This shard's slice of the flat parameters, ``[lo, hi)``."""
        self.vectors: dict[int, np.ndarray] = {X_SLOT: np.array(x0[self.lo : self.hi],
                                                                dtype=np.float64)}
        """This shard's slice of each vector, by slot (``X_SLOT``: the parameters)."""
        self.evaluation, self.point, self.grad, self.rows = -1, X_SLOT, X_SLOT, 1
        """The current evaluation's number, its point's and gradient's slots and its row count
        (``evaluation``, ``point``, ``grad``, ``rows``)."""
        self.got = np.ones(0, dtype=bool)
        """Per portion of the current evaluation: whether its gradient slice was added."""
        self.deferred: list[tuple[int, int]] = []
        """(worker index, evaluation) of early fetches"""
        self.added = self.discarded = 0
        """Portions' gradient slices added and discarded (duplicates, stale)."""
        n = self.hi - self.lo
        self.push_boxes = [np.empty(2 + n) for _ in workers]
        """Per worker: the box its next push lands in."""
        self.fetch_boxes = [np.empty(1) for _ in workers]
        """Per worker: the box its next fetch request lands in."""
        self.outboxes = [np.empty(1 + n) for _ in workers]
        """Per worker: the point's slice sent in answer to a fetch."""
        self.sends: list[Any] = [None] * len(workers)
        """Per worker: the send of its last answer, or None."""
        self.receives = [comm.irecv(box, w, PUSH) for box, w in zip(self.push_boxes, workers)]
        """The receives of every worker's next push and fetch."""
        self.receives += [comm.irecv(box, w, FETCH) for box, w in zip(self.fetch_boxes, workers)]

    def slot(self, k: int) -> np.ndarray:
        if k not in self.vectors:
            self.vectors[k] = np.zeros(self.hi - self.lo)
        return self.vectors[k]

    def execute(self, commands: np.ndarray) -> list[float]:
        out: list[float] = []
        for op, a, b, c, value in commands:
            op, a, b, c = int(op), int(a), int(b), int(c)
            if op == COPY:
                np.copyto(self.slot(b), self.slot(a))
            elif op == AXPY:
                self.slot(b)[...] += value * self.slot(a)
            elif op == SCALE:
                self.slot(a)[...] *= value
            elif op == SUB:
                np.subtract(self.slot(a), self.slot(b), out=self.slot(c))
            elif op == DOT:
                out.append(float(self.slot(a) @ self.slot(b)))
            elif op == NORMS:
                v = np.abs(self.slot(a))
                out += [float(v.max(initial=0.0)), float(v.sum())]
            elif op == BEGIN:  # a: point, b: gradient, c: portions, value: evaluation
                self.evaluation, self.point, self.grad = int(value), a, b
                self.slot(b)[...] = 0.0
                self.got = np.zeros(c, dtype=bool)
                ready = [(i, e) for i, e in self.deferred if e <= self.evaluation]
                self.deferred = [(i, e) for i, e in self.deferred if e > self.evaluation]
                for i, _ in ready:
                    self._answer(i)
            elif op == SEAL:  # a: rows of the batch
                poll_until(self.got.all, idle=self.poll)
                self.slot(self.grad)[...] *= 1.0 / a
            elif op == QUIT:  # a: the slot of the final x
                np.copyto(self.slot(X_SLOT), self.slot(a))
                if self.workers:
                    cancel_all(self.comm, self.receives)
                    poll_all(self.comm, self.sends)
            elif op != GATHER:  # GATHER is answered by the host, with the slice
                raise ValueError(f"VectorShard: unknown command {op} (slots {a}, {b}, {c})")
        return out

    def poll(self) -> bool:
        """Handle the workers' messages that have arrived; whether there were any."""
        if not self.workers:
            return False
        done = self.comm.testsome(self.receives)
        if not done:
            return False
        k = len(self.workers)
        for j in done:
            i = j % k
            if j < k:
                self._push(i)
                self.receives[j] = self.comm.irecv(self.push_boxes[i], self.workers[i], PUSH)
            else:
                e = int(self.fetch_boxes[i][0])
                if e > self.evaluation:
                    self.deferred.append((i, e))
                else:
                    self._answer(i)
                self.receives[j] = self.comm.irecv(self.fetch_boxes[i], self.workers[i], FETCH)
        return True

    def _push(self, i: int) -> None:
        box = self.push_boxes[i]
        e, p = int(box[0]), int(box[1])
        if e == self.evaluation and not self.got[p]:
            self.slot(self.grad)[...] += box[2:]
            self.got[p] = True
            self.added += 1
        else:  # a backup's loser, or a portion of an evaluation already sealed
            self.discarded += 1

    def _answer(self, i: int) -> None:
        poll_all(self.comm, [self.sends[i]])
        out = self.outboxes[i]
        out[0] = self.evaluation
        out[1:] = self.slot(self.point)
        self.sends[i] = self.comm.isend(out, self.workers[i], PARAMS)


class ShardVectors:
    """The coordinator's handle on the sharded vectors: Level 2's ``VectorOps`` on slot
    numbers. Commands queue up and go out in one message per shard when an answer is needed
    (``dots``, ``norms``) or work must start (``flush``)."""

    def __init__(self, comm: Communicator, local: VectorShard, remote: list[int],
                 bounds: list[tuple[int, int]], poll: Callable[[], bool]) -> None:
        self.comm, self.local, self.remote, self.bounds, self.poll = (
            comm, local, remote, bounds, poll)
        """``comm``: every rank. ``local``: the coordinator's own shard. ``remote``: the other
        shards' ranks. ``bounds``: each shard's slice. ``poll``: serves the workers while
        waiting."""
        self.queue: list[list[float]] = []
        """Command rows not yet sent."""
        self.free: list[int] = []
        """Slots freed for reuse."""
        self.next_slot = X_SLOT + 1
        """The next slot never used."""
        self.sends: list[Any] = []
        """The sends of the last command messages."""
        self.outbox = np.empty(1 + MAX_COMMANDS * WIDTH)
        """The command message being sent."""
        self.replies = [np.empty(2 * MAX_COMMANDS) for _ in remote]
        """Per remote shard: the box its answers land in."""
        self.round_trips = 0
        """Command messages that waited for answers."""

    def alloc(self) -> int:
        if self.free:
            return self.free.pop()
        self.next_slot += 1
        return self.next_slot - 1

    def release(self, *slots: int) -> None:
        for s in slots:
            if s not in self.free:
                self.free.append(s)

    def command(self, op: int, a: int = 0, b: int = 0, c: int = 0, value: float = 0.0) -> None:
        if len(self.queue) == MAX_COMMANDS:
            raise RuntimeError(f"Sandblaster: more than {MAX_COMMANDS} vector commands queued "
                               "without an answer needed; use a shorter history")
        self.queue.append([op, a, b, c, value])

    def flush(self) -> list[np.ndarray]:
        """Send the queue to every shard; when it holds reductions, wait for every shard's
        answers (this rank's shard first)."""
        rows = np.array(self.queue, dtype=np.float64).reshape(-1, WIDTH)
        self.queue = []
        if not len(rows):
            return []
        ops = rows[:, 0].astype(int)
        reductions = int(np.count_nonzero(ops == DOT) + 2 * np.count_nonzero(ops == NORMS))
        poll_all(self.comm, self.sends)  # the outbox is free again
        self.outbox[0] = len(rows)
        self.outbox[1 : 1 + rows.size] = rows.ravel()
        waits = [self.comm.irecv(box, s, REPLY) for box, s in zip(self.replies, self.remote)] \
            if reductions else []
        self.sends = [self.comm.isend(self.outbox[: 1 + rows.size], s, CMD)
                      for s in self.remote]
        answers = [np.array(self.local.execute(rows))]
        if reductions:
            self.round_trips += 1
            self._wait(waits)
            answers += [box[:reductions].copy() for box in self.replies]
        return answers

    def _wait(self, requests: list[Any]) -> None:
        """Complete ``requests``, handling this rank's shard's workers meanwhile."""
        poll(self.comm, requests, "all", idle=self.poll)

    def copy(self, x: int) -> int:
        y = self.alloc()
        self.command(COPY, x, y)
        return y

    def dots(self, pairs: list[tuple[int, int]]) -> list[float]:
        for a, b in pairs:
            self.command(DOT, a, b)
        answers = self.flush()
        return [float(v) for v in np.sum(answers, axis=0)] if pairs else []

    def axpy(self, alpha: float, x: int, y: int) -> None:
        self.command(AXPY, x, y, value=alpha)

    def scale(self, alpha: float, x: int) -> None:
        self.command(SCALE, x, value=alpha)

    def norms(self, x: int) -> tuple[float, float]:
        """(max |x_i|, sum |x_i|) over every shard."""
        self.command(NORMS, x)
        answers = np.array(self.flush())
        return float(answers[:, 0].max()), float(answers[:, 1].sum())

    def gather(self, x: int, out: np.ndarray) -> None:
        """The whole vector ``x`` into ``out`` (the shards send their slices)."""
        (lo, hi), rest = self.bounds[0], self.bounds[1:]
        waits = [self.comm.irecv(out[a:b], s, GATHERED) for s, (a, b) in zip(self.remote, rest)]
        self.command(GATHER, x)
        self.flush()
        out[lo:hi] = self.local.slot(x)
        self._wait(waits)
