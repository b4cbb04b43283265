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

from collections import deque
from typing import Any

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import Params
from meta.lv2.second_order import LBFGS, line_search, two_loop
from meta.lv3.comm.communicator import Communicator, world
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import poll, poll_all
from meta.lv3.flat import shard_bounds
from meta.lv3.sandblaster.portions import Dispatcher, PortionStats, PortionWorker
from meta.lv3.sandblaster.rows import Evaluation, RowsEvaluator, RowsFunction, TrainingRows
from meta.lv3.sandblaster.shards import (
    BEGIN,
    CMD,
    COPY,
    GATHER,
    GATHERED,
    MAX_COMMANDS,
    QUIT,
    REPLY,
    SEAL,
    SUB,
    WIDTH,
    X_SLOT,
    ShardVectors,
    VectorShard,
)
from meta.lv3.strategy import Strategy
from meta.lv3.timeline import Timeline
from meta.lv3.workload import Workload

__all__ = ["Evaluation", "RowsEvaluator", "RowsFunction", "Sandblaster", "TrainingRows"]


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
    def check(cls, optimizer: Any, comm: Communicator, workload: Workload | None) -> None:
        if comm.size > 1 and workload is not None and workload.augmented:
            raise ComponentError("distributed 'sandblaster' cannot use 'augmentation': its "
                                 "workers evaluate the stored rows of the batch")

    @classmethod
    def from_recipe(cls, optimizer: Any, comm: Communicator, workload: Workload | None,
                    **options: Any) -> Strategy:
        """Sandblaster over the workload's training rows; a recipe on one process runs plain
        L-BFGS (its line search evaluates the whole batch through the trainer's closure)."""
        if comm.size == 1 and workload is not None:
            from meta.lv3.data_parallel.allreduce import Allreduce

            return Allreduce(optimizer, comm, chunk_bytes=options["chunk_bytes"])
        rows = TrainingRows(workload) if workload is not None else None
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
        """``lbfgs``: the wrapped Level 2 L-BFGS (its history and line search). ``evaluate``: the
        rows evaluator (workers)."""
        self.portions, self.backups, self.track_params = portions, backups, track_params
        """``portions``: pieces each batch's evaluation is cut into. ``backups``: whether idle
        workers get copies of unfinished portions. ``track_params``: whether every rank keeps
        the parameters up to date."""
        self.coordinator = 0
        """The coordinator's rank (0): it runs L-BFGS and holds shard 0."""
        n_servers = servers if comm.size > 1 else 1
        self.shard_ranks = [0] + list(range(comm.size - n_servers + 1, comm.size))
        """The shards' ranks, the coordinator's first."""
        self.workers = list(range(1, comm.size - n_servers + 1))
        """The workers' ranks."""
        if slow_worker is not None and not 0 <= slow_worker < max(len(self.workers), 1):
            raise ValueError(f"Sandblaster: slow_worker={slow_worker} is not a worker index "
                             f"(0..{len(self.workers) - 1})")
        self.slowdown = slowdown
        """How many times slower ``slow_rank`` pretends to be (a test of backups)."""
        self.slow_rank = self.workers[slow_worker] if slow_worker is not None and \
            self.workers else None
        """The worker that pretends to be slow, or None."""
        self.bounds = shard_bounds(len(self.flat_params), n_servers)
        """Each shard's slice of the flat parameters."""
        self.part = ("coordinator" if comm.rank == 0 else
                     "shard" if comm.rank in self.shard_ranks else "worker")
        """This rank's part: "coordinator", "shard" or "worker"."""
        self.role = "worker" if self.part == "coordinator" else "server"
        self.group = comm.split(int(self.role == "server")) if comm.size > 1 else comm
        self.iterations = 0
        """L-BFGS iterations done."""
        self.stats = PortionStats(len(self.workers))
        """What the coordinator saw of the portions (counted, discarded, backups)."""
        self.shard_stats = np.zeros(2)
        """gradient slices added / discarded, over the shards"""
        x0 = self.flat_params.buffer.astype(np.float64)
        if self.part != "worker":
            index = self.shard_ranks.index(comm.rank)
            self.local = VectorShard(comm, self.bounds[index], x0,
                                     self.workers if comm.size > 1 else [])
            """This rank's shard of the vectors (coordinator and shards)."""
        if self.part == "coordinator" and comm.size > 1:
            self.vectors = ShardVectors(comm, self.local, self.shard_ranks[1:], self.bounds,
                                        self.local.poll)
            """The coordinator's handle on the sharded vectors."""
            self.dispatcher = Dispatcher(self)
            """The coordinator's hand-out of portions to workers."""
            self.stats = self.dispatcher.stats
            self.x, self.g = X_SLOT, self.vectors.alloc()
            """The slots of the parameters (``x``) and their gradient (``g``)."""
            self.pairs: deque[tuple[int, int]] = deque()
            """The L-BFGS history: (s, y) slot pairs, oldest first."""
            self.last_rows: np.ndarray | None = None
            """the batch the point's f and g are of"""
            self.f, self.correct = 0.0, 0
            """``f``: the loss at ``x``. ``correct``: rows classified correctly there."""
            self.evaluation = 0
            """Evaluations run."""
        elif self.part == "worker":
            self.worker = PortionWorker(self)
            """This worker rank's evaluation loop."""

    @classmethod
    def replica(cls, rank: int, size: int, **options: Any) -> tuple[int, int]:
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
            poll(comm, [comm.irecv(inbox, self.coordinator, CMD)], idle=shard.poll)
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
