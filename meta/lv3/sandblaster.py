"""Sandblaster L-BFGS (seed 001: DistBelief's batch method, next to Downpour SGD).

A coordinator runs L-BFGS (Level 2's two-loop recursion and strong-Wolfe line search, reused
through their vector interface) without holding its vectors: the parameters, the gradients and
the (s, y) history live in slices on ``servers`` shards, and the coordinator only sends them
small commands (copy, axpy, scale, subtract, dot products, norms) whose answers are scalars.
Every loss and gradient the method needs (at x_k, and at each trial point of the line search)
is one *evaluation*: the coordinator has the shards publish the point, cuts the batch into
``portions`` pieces and hands them out one at a time to whichever worker is idle, so a faster
worker takes more. A worker fetches the point from the shards (once per evaluation), computes
the loss and gradient sums of its rows and pushes the gradient slices to the shards, which add
each portion once; its loss goes to the coordinator. Near the end of an evaluation, when no
portion is left to hand out, idle workers get *backup* copies of the unfinished portions; the
first result of a portion wins, later copies are discarded (by the coordinator and by every
shard alike: portions are counted once). The coordinator then seals the evaluation: each shard
waits until it has every portion's gradient and divides by the batch size.

Ranks: 0 is the coordinator and also hosts shard 0 (its commands are then function calls); the
last ``servers - 1`` ranks host the other shards; the ranks between are workers. So ``-n 3``
gives 2 workers with ``servers=1``, and ``-n 4`` 2 workers with ``servers=2`` (one shard on its
own rank) or 3 with ``servers=1``. The coordinator gathers x once per iteration only so that the
trainer can evaluate, log and checkpoint (``track_params``; none of the L-BFGS arithmetic needs
it). ``slow_worker``/``slowdown`` make one worker sleep ``slowdown - 1`` times its compute time
after each portion (sleep, so a straggler costs no CPU), for tests and benchmarks.

On one process ``step_rows`` runs the wrapped Level 2 ``LBFGS`` on the whole batch.

>>> from meta.lv2.second_order import LBFGS
>>> params = {"w": np.zeros(1)}
>>> def rows_loss(rows):  # sum over rows of (w - 3)^2 / 2, its gradient, nothing to count
...     return Evaluation(len(rows) * 0.5 * (params["w"][0] - 3) ** 2,
...                       {"w": len(rows) * (params["w"] - 3)}, 0)
>>> opt = Sandblaster(LBFGS(params), evaluate=RowsFunction(rows_loss, examples=4))
>>> [opt.step_rows(np.arange(4)) for _ in range(2)], opt.params["w"].round(6).tolist()
([(4.5, 0), (2.0, 0)], [3.0])
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from meta.component import ComponentError, Option
from meta.lv2.optimizers import Params
from meta.lv2.second_order import LBFGS, line_search, two_loop
from meta.lv3.communicator import Communicator, _import_mpi, world
from meta.lv3.costmodel import Link
from meta.lv3.downpour import shard_bounds
from meta.lv3.polling import POLL_S, cancel_all, poll_all
from meta.lv3.strategy import Strategy
from meta.lv3.timeline import Timeline

# Message tags (Downpour's are 31-37).
CMD, REPLY, ROWS, TASK, RESULT, PUSH, FETCH, PARAMS, STOP, GATHERED = range(41, 51)
# Vector commands, one row [op, a, b, c, value] each; a, b, c are slot numbers.
COPY, AXPY, SCALE, SUB, DOT, NORMS, BEGIN, SEAL, GATHER, QUIT = range(10)
WIDTH = 5  # floats per command row
MAX_COMMANDS = 256  # rows per command message (two_loop's first dots: history + 1)
X_SLOT = 0  # where every shard keeps its slice of the initial parameters
# A RESULT: evaluation, portion, loss sum, correct, rows, compute seconds, skipped (stale point)
RESULT_FIELDS = 7


class Evaluation(NamedTuple):
    """A portion's sums: loss summed over its rows, gradients of that sum, count correct."""

    loss_sum: float
    grads: Params
    correct: int


class RowsEvaluator(Protocol):
    """Evaluates rows (indices below ``examples``) of a dataset at the current parameters."""

    examples: int

    def __call__(self, rows: np.ndarray) -> Evaluation: ...


class RowsFunction:
    """A ``RowsEvaluator`` from a function of the rows."""

    def __init__(self, function: Callable[[np.ndarray], Evaluation], examples: int) -> None:
        self.function, self.examples = function, examples

    def __call__(self, rows: np.ndarray) -> Evaluation:
        return self.function(rows)


class TrainerRows:
    """Rows of a Level 2 trainer's training data through its executor (mean loss graph)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.examples = len(trainer.train_data)

    def __call__(self, rows: np.ndarray) -> Evaluation:
        t, n = self.trainer, self.trainer.names
        x, y = t.train_data.batch(rows)
        values, grads = t.executor.inference_and_backprop(
            {n["input"]: x, n["labels"]: y}, loss=n["loss"], outputs=[n["logits"]])
        count = len(rows)
        return Evaluation(float(values[n["loss"]]) * count,
                          {k: np.asarray(g) * count for k, g in grads.items()},
                          int(np.count_nonzero(values[n["logits"]].argmax(1) == y)))


def _wait_any(comm: Communicator, requests: list[Any], idle: Callable[[], bool]) -> int:
    """Index of a completed request of ``requests``; ``idle()`` (true when it did some work)
    runs between tests, and the loop sleeps when it did none (see ``meta.lv3.polling``)."""
    MPI = _import_mpi()  # noqa: N806
    while True:
        index, done = MPI.Request.Testany(requests)
        if done and index != MPI.UNDEFINED:
            return index
        if not idle():
            time.sleep(POLL_S)


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
        self.lo, self.hi = bounds
        self.vectors: dict[int, np.ndarray] = {X_SLOT: np.array(x0[self.lo : self.hi],
                                                                dtype=np.float64)}
        self.evaluation, self.point, self.grad, self.rows = -1, X_SLOT, X_SLOT, 1
        self.got = np.ones(0, dtype=bool)
        self.deferred: list[tuple[int, int]] = []  # (worker index, evaluation) of early fetches
        self.added = self.discarded = 0
        n = self.hi - self.lo
        self.push_boxes = [np.empty(2 + n) for _ in workers]
        self.fetch_boxes = [np.empty(1) for _ in workers]
        self.outboxes = [np.empty(1 + n) for _ in workers]
        self.sends: list[Any] = [None] * len(workers)
        self.receives = [comm.irecv(box, w, PUSH) for box, w in zip(self.push_boxes, workers)]
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
                while not self.got.all():
                    if not self.poll():
                        time.sleep(POLL_S)
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
        MPI = _import_mpi()  # noqa: N806
        done = MPI.Request.Testsome(self.receives)
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
        self.queue: list[list[float]] = []
        self.free: list[int] = []
        self.next_slot = X_SLOT + 1
        self.sends: list[Any] = []
        self.outbox = np.empty(1 + MAX_COMMANDS * WIDTH)
        self.replies = [np.empty(2 * MAX_COMMANDS) for _ in remote]
        self.round_trips = 0

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
        MPI = _import_mpi()  # noqa: N806
        while requests and not MPI.Request.Testall(requests):
            if not self.poll():
                time.sleep(POLL_S)

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


class PortionStats:
    """What the coordinator saw: per worker portions counted and results discarded, backups,
    evaluation (batch) times."""

    def __init__(self, workers: int) -> None:
        self.completed = np.zeros(workers, dtype=np.int64)  # results counted
        self.discarded = np.zeros(workers, dtype=np.int64)  # duplicates, stale, skipped
        self.backups_issued = self.backups_won = 0
        self.batch_times: list[float] = []  # seconds per evaluation

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
        self.workers = owner.workers
        self.results = [np.empty(RESULT_FIELDS) for _ in self.workers]
        self.receives = [self.comm.irecv(box, w, RESULT)
                         for box, w in zip(self.results, self.workers)]
        self.tasks = [np.empty(4, dtype=np.int64) for _ in self.workers]
        self.task_sends: list[Any] = [None] * len(self.workers)
        self.busy: list[tuple[int, int] | None] = [None] * len(self.workers)
        self.rows = np.empty(0, dtype=np.int64)
        self.rows_sends: list[Any] = []
        self.evaluation = 0
        self.stats = PortionStats(len(self.workers))

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
        if owner.evaluate is None:
            raise ValueError(f"Sandblaster: worker rank {owner.comm.rank} has no rows "
                             "evaluator (pass evaluate=...)")
        self.evaluate = owner.evaluate
        self.inbox = np.empty(owner.evaluate.examples + 1, dtype=np.int64)
        self.rows = np.empty(0, dtype=np.int64)
        self.fetched = -1  # the evaluation whose point is in the parameters
        n = len(owner.flat_params)
        self.point = np.empty(n)
        self.param_boxes = [np.empty(1 + hi - lo) for lo, hi in owner.bounds]
        self.push_boxes = [np.empty(2 + hi - lo) for lo, hi in owner.bounds]
        self.result = np.empty(RESULT_FIELDS)
        self.slow = owner.slowdown if owner.comm.rank == owner.slow_rank else 1.0

    def run(self) -> None:
        coordinator = self.owner.coordinator
        MPI = _import_mpi()  # noqa: N806
        status = MPI.Status()
        while True:
            request = self.comm.irecv(self.inbox, coordinator)
            while not request.Test(status):
                time.sleep(POLL_S)
            tag = status.Get_tag()
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


class Sandblaster(Strategy):
    """Sandblaster L-BFGS: a coordinator commands sharded vector operations and hands out
    portions of each evaluation to workers (with backups). Wraps a Level 2 ``LBFGS`` (its
    ``history`` and ``max_line_search``); train with ``step_rows(rows)``."""

    name = "sandblaster"
    consistent = False
    evaluates_rows = True
    takes_line_search = True
    options = {**Strategy.options,
               "servers": Option(1, "shards of the parameters and L-BFGS history (shard 0 on "
                                 "the coordinator)", low=1),
               "portions": Option(8, "pieces each batch evaluation is cut into for the "
                                  "workers", low=1)}

    @classmethod
    def check(cls, trainer: Any, comm: Communicator) -> None:
        if comm.size > 1 and trainer.transform is not None:
            raise ComponentError("distributed 'sandblaster' cannot use 'augmentation': its "
                                 "workers evaluate the stored rows of the batch")

    @classmethod
    def from_recipe(cls, optimizer: Any, comm: Communicator, trainer: Any,
                    **options: Any) -> Strategy:
        """Sandblaster over the trainer's rows; a recipe on one process runs plain L-BFGS (its
        line search evaluates the whole batch through the trainer's closure)."""
        if comm.size == 1 and trainer is not None:
            from meta.lv3.allreduce import Allreduce

            return Allreduce(optimizer, comm, chunk_bytes=options["chunk_bytes"])
        rows = TrainerRows(trainer) if trainer is not None else None
        return cls(optimizer, comm, evaluate=rows, **options)

    def __init__(self, optimizer: LBFGS, comm: Communicator | None = None, *,
                 evaluate: RowsEvaluator | None = None, servers: int = 1, portions: int = 8,
                 backups: int = 1, slow_worker: int | None = None, slowdown: float = 1.0,
                 track_params: bool = True, chunk_bytes: int | None = None,
                 timeline: Timeline | None = None) -> None:
        comm = world() if comm is None else comm
        if not isinstance(optimizer, LBFGS):
            raise TypeError(f"Sandblaster: wraps a meta.lv2 LBFGS (its history and line "
                            f"search settings), got {type(optimizer).__name__}; set the "
                            f"recipe's optimizer to 'lbfgs'")
        for key, value, low in (("servers", servers, 1), ("portions", portions, 1),
                                ("backups", backups, 0)):
            if isinstance(value, bool) or int(value) != value or value < low:
                raise ValueError(f"Sandblaster: {key} must be an integer >= {low}, "
                                 f"got {value!r}")
        if not slowdown >= 1:
            raise ValueError(f"Sandblaster: slowdown must be >= 1, got {slowdown!r}")
        if comm.size > 1 and comm.size - servers < 1:
            raise ValueError(f"Sandblaster: servers={servers} (shard 0 on the coordinator, "
                             f"{servers - 1} on their own ranks) leaves no worker among "
                             f"{comm.size} ranks; run with more ranks or fewer servers")
        options = {"timeline": timeline}
        if chunk_bytes is not None:
            options["chunk_bytes"] = chunk_bytes
        super().__init__(optimizer, comm, **options)
        self.lbfgs, self.evaluate = optimizer, evaluate
        self.portions, self.backups, self.track_params = portions, backups, track_params
        self.coordinator = 0
        n_servers = servers if comm.size > 1 else 1
        self.shard_ranks = [0] + list(range(comm.size - n_servers + 1, comm.size))
        self.workers = list(range(1, comm.size - n_servers + 1))
        if slow_worker is not None and not 0 <= slow_worker < max(len(self.workers), 1):
            raise ValueError(f"Sandblaster: slow_worker={slow_worker} is not a worker index "
                             f"(0..{len(self.workers) - 1})")
        self.slowdown = slowdown
        self.slow_rank = self.workers[slow_worker] if slow_worker is not None and \
            self.workers else None
        self.bounds = shard_bounds(len(self.flat_params), n_servers)
        self.part = ("coordinator" if comm.rank == 0 else
                     "shard" if comm.rank in self.shard_ranks else "worker")
        self.role = "worker" if self.part == "coordinator" else "server"
        self.group = comm.split(int(self.role == "server")) if comm.size > 1 else comm
        self.iterations = 0
        self.stats = PortionStats(len(self.workers))
        self.shard_stats = np.zeros(2)  # gradient slices added / discarded, over the shards
        x0 = self.flat_params.buffer.astype(np.float64)
        if self.part != "worker":
            index = self.shard_ranks.index(comm.rank)
            self.local = VectorShard(comm, self.bounds[index], x0,
                                     self.workers if comm.size > 1 else [])
        if self.part == "coordinator" and comm.size > 1:
            self.vectors = ShardVectors(comm, self.local, self.shard_ranks[1:], self.bounds,
                                        self.local.poll)
            self.dispatcher = Dispatcher(self)
            self.stats = self.dispatcher.stats
            self.x, self.g = X_SLOT, self.vectors.alloc()
            self.pairs: deque[tuple[int, int]] = deque()
            self.last_rows: np.ndarray | None = None  # the batch the point's f and g are of
            self.f, self.correct = 0.0, 0
            self.evaluation = 0
        elif self.part == "worker":
            self.worker = PortionWorker(self)

    @classmethod
    def replica(cls, rank: int, size: int) -> tuple[int, int]:
        """Every rank holds the whole data set: portions of any batch go to any worker."""
        return 0, 1

    # -- the coordinator's L-BFGS iteration -------------------------------------------------

    def step_rows(self, rows: np.ndarray) -> tuple[float, int]:
        """One L-BFGS iteration (line search included) on the batch ``rows``; returns the
        loss and the count correct at the parameters before it."""
        if self.part != "coordinator":
            raise RuntimeError(f"Sandblaster.step_rows: rank {self.comm.rank} is a "
                               f"{self.part}, not the coordinator")
        if self.comm.size == 1:
            return self._step_locally(np.asarray(rows))
        self.timeline.begin()
        rows = np.asarray(rows, dtype=np.int64)
        ops = self.vectors
        same = self.last_rows is not None and len(rows) == len(self.last_rows) and \
            np.array_equal(np.sort(rows), np.sort(self.last_rows))
        if not same:  # the line search's last point was on another batch: evaluate at x_k
            self.dispatcher.send_rows(rows)
            self.f, self.correct = self._evaluate(self.x, self.g, len(rows))
            ops.flush()
        self.last_rows = rows
        loss, correct = self.f, self.correct
        largest, total = ops.norms(self.g)
        self.timeline.lap("communicate")
        if largest <= self.lbfgs.tolerance_grad:  # converged
            return loss, correct
        d = two_loop(self.g, list(self.pairs), ops)
        step = 1.0 if self.pairs else min(1.0, 1.0 / max(total, 1e-12))
        (d0,) = ops.dots([(self.g, d)])
        self.timeline.lap("communicate")
        alpha, f, g_new = self._line_search(d, d0, step)
        x_new = ops.copy(self.x)
        ops.axpy(alpha, d, x_new)
        s, y = ops.alloc(), ops.alloc()
        ops.command(SUB, x_new, self.x, s)
        ops.command(SUB, g_new, self.g, y)
        sy, yy = ops.dots([(s, y), (y, y)])
        if sy > 1e-10 * yy:
            self.pairs.append((s, y))
            if len(self.pairs) > self.lbfgs.pairs.maxlen:
                ops.release(*self.pairs.popleft())
        else:
            ops.release(s, y)
        ops.release(self.x, d, *([self.g] if g_new != self.g else []))
        self.x, self.g, self.f = x_new, g_new, f
        self.correct = self.line_correct
        self.iterations += 1
        if self.track_params:
            self._gather()
        self.timeline.lap("communicate")
        return loss, correct

    def _line_search(self, d: int, d0: float, step: float) -> tuple[float, float, int]:
        """Level 2's strong-Wolfe search; each trial point is an evaluation. Trial gradients
        are kept only while the search may return them: the latest and the lowest-loss one
        (``line_search``'s contract)."""
        ops, rows = self.vectors, len(self.last_rows)
        point = ops.alloc()
        held = {"latest": -1, "best": self.g, "best_f": self.f}
        corrects: dict[int, int] = {self.g: self.correct}

        def phi(alpha: float) -> tuple[float, float, int]:
            latest = held["latest"]
            if latest not in (-1, held["best"]):
                ops.release(latest)
            grad = ops.alloc()
            ops.command(COPY, self.x, point)
            ops.axpy(alpha, d, point)
            f, correct = self._evaluate(point, grad, rows)
            (slope,) = ops.dots([(grad, d)])
            corrects[grad] = correct
            held["latest"] = grad
            if f < held["best_f"]:
                if held["best"] not in (self.g, grad):
                    ops.release(held["best"])
                held["best"], held["best_f"] = grad, f
            return f, slope, grad

        alpha, f, g, _ = line_search(phi, self.f, d0, self.g, step, c2=0.9,
                                         max_evals=self.lbfgs.max_line_search)
        ops.release(point, *(h for h in {held["latest"], held["best"]}
                             if h not in (-1, self.g, g)))
        self.line_correct = corrects[g]
        return alpha, f, g

    def _evaluate(self, point: int, grad: int, rows: int) -> tuple[float, int]:
        """Loss and count correct at ``point``; its mean gradient goes to slot ``grad``.
        A batch of fewer rows than ``portions`` is cut into one portion per row: an empty
        portion's mean loss is NaN (0 / 0), which summed into the batch's loss made it NaN."""
        self.evaluation += 1
        self.lbfgs.evaluations += 1
        portions = min(self.portions, rows)
        self.vectors.command(BEGIN, point, grad, portions, value=self.evaluation)
        self.vectors.flush()
        self.timeline.lap("communicate")
        loss_sum, correct = self.dispatcher.run(self.evaluation, rows, portions)
        self.timeline.lap("portions")  # waiting for the workers' results
        self.vectors.command(SEAL, rows)
        return loss_sum / rows, correct

    def _gather(self) -> None:
        x = np.empty(len(self.flat_params))
        self.vectors.gather(self.x, x)
        self.flat_params.buffer[...] = x

    def _step_locally(self, rows: np.ndarray) -> tuple[float, int]:
        if self.evaluate is None:
            raise ValueError("Sandblaster.step_rows: no rows evaluator (pass evaluate=...)")
        first: list[int] = []

        def closure() -> tuple[float, Params]:
            loss_sum, grads, correct = self.evaluate(rows)
            first.append(correct)
            return loss_sum / len(rows), {k: np.asarray(g) / len(rows) for k, g in grads.items()}

        loss = self.lbfgs.step(closure)
        self.iterations += 1
        return float(loss), first[0]

    def step(self, grads: Params) -> None:
        raise TypeError("Sandblaster has its batches evaluated by its workers: call "
                        "step_rows(rows), not step(grads) (the trainer does when "
                        "evaluates_rows is true)")

    # -- workers and shards, and the end ----------------------------------------------------

    def serve(self) -> None:
        """A worker's or a shard rank's loop, until the coordinator's ``finish``."""
        if self.part == "worker":
            self.worker.run()
        elif self.part == "shard":
            self._serve_shard()
        else:
            raise RuntimeError(f"Sandblaster.serve: rank {self.comm.rank} is the coordinator")
        self._final()

    def _serve_shard(self) -> None:
        comm, shard = self.comm, self.local
        inbox = np.empty(1 + MAX_COMMANDS * WIDTH)
        reply = np.empty(2 * MAX_COMMANDS)
        gathered = np.empty(shard.hi - shard.lo)
        sends: list[Any] = []
        while True:
            request = comm.irecv(inbox, self.coordinator, CMD)
            while not request.Test():
                if not shard.poll():
                    time.sleep(POLL_S)
            rows = inbox[1 : 1 + int(inbox[0]) * WIDTH].reshape(-1, WIDTH)
            answers = shard.execute(rows)
            for op, a, *_ in rows:
                if int(op) == GATHER:
                    poll_all(comm, sends)
                    np.copyto(gathered, shard.slot(int(a)))
                    sends = [comm.isend(gathered, self.coordinator, GATHERED)]
            if answers:
                poll_all(comm, sends)
                reply[: len(answers)] = answers
                sends = [comm.isend(reply[: len(answers)], self.coordinator, REPLY)]
            if QUIT in rows[:, 0].astype(int):
                poll_all(comm, sends)
                return

    def finish(self) -> None:
        """End of training (collective): stop the workers and shards, and leave every rank
        with the final parameters and the coordinator's counts."""
        if self.comm.size == 1:
            return
        if self.part != "coordinator":
            raise RuntimeError(f"Sandblaster.finish: rank {self.comm.rank} is a {self.part}; "
                               "workers and shards end in serve()")
        # Workers push before they report, so once every result is in, so is every push.
        self.dispatcher.drain()
        self.vectors.command(QUIT, self.x)
        self.vectors.flush()
        poll_all(self.comm, self.vectors.sends)
        self._final()

    def _final(self) -> None:
        x = np.empty(len(self.flat_params))
        if self.part != "worker":
            lo, hi = self.local.lo, self.local.hi
            x[lo:hi] = self.local.slot(X_SLOT)
        for root, (lo, hi) in zip(self.shard_ranks, self.bounds):
            self.comm.bcast(x[lo:hi], root=root)
        self.flat_params.buffer[...] = x
        counts = np.zeros(2)
        if self.part != "worker":
            counts[:] = (self.local.added, self.local.discarded)
        self.shard_stats = self.comm.allreduce(counts)
        summary = self.comm.bcast_obj(
            (self.stats.completed.tolist(), self.stats.discarded.tolist(),
             self.stats.backups_issued, self.stats.backups_won, self.stats.batch_times,
             self.iterations, self.lbfgs.evaluations), root=0)
        (completed, discarded, self.stats.backups_issued, self.stats.backups_won,
         self.stats.batch_times, self.iterations, self.lbfgs.evaluations) = summary
        self.stats.completed, self.stats.discarded = np.array(completed), np.array(discarded)

    # -- reports ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Counters only: the (s, y) history lives on the shards, so a resumed run starts a
        fresh one (as a compressor's residual does)."""
        return {"evaluations": self.lbfgs.evaluations, "iterations": self.iterations}

    def load_state_dict(self, saved: dict) -> None:
        self.lbfgs.evaluations = int(saved.get("evaluations", 0))
        self.iterations = int(saved.get("iterations", 0))

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update(self.stats.metrics())
        out.update(iterations=float(self.iterations),
                   loss_evaluations=float(self.lbfgs.evaluations),
                   shard_slices_added=float(self.shard_stats[0]),
                   shard_slices_discarded=float(self.shard_stats[1]))
        return out

    def report_text(self) -> str:
        return self.stats.format() if self.comm.size > 1 else ""

    def predict_comm_s(self, link: Link) -> float:
        """Per iteration, about two evaluations: each worker fetches and pushes the vector
        once per evaluation it takes part in; plus the vector commands' round trips."""
        if self.comm.size == 1:
            return 0.0
        nbytes = 8 * len(self.flat_params)
        round_trips = 2 * self.lbfgs.pairs.maxlen + 6
        return 2 * (2 * link.message(nbytes) + link.message(64)) + round_trips * \
            link.message(64)
