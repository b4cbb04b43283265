"""The asynchronous strategies' patterns, measured on this node by ``meta plan --calibrate``:
every rank but the last steps the recipe and then exchanges its gradient with the last rank,
which serves one message at a time, as the asynchronous parameter server and Downpour run.

Why the patterns and not their parts. On a node with more ranks than cores (3 and 4 ranks on
the 2-core machine of ``docs/results/planner_validation.md``) no part behaves as it does alone:

- A worker's exchange waits on polled handoffs (``meta.lv3.comm.polling``: test, sleep, test)
  of a server and a worker that must be scheduled between computing ranks. A polled ping-pong
  of the parameter server's 0.94 MB, with the other ranks waiting in a collective, took
  0.3-0.5 ms a round trip; the same exchange in a run took 1.5-3 ms at 3 and 4 ranks.
- A worker's step ran 1.2-1.6x its time measured with every rank stepping at once (the
  calibration of the synchronous strategies), although fewer ranks compute at a time: the
  polling server's wakeups share the cores. Scaling by the computing ranks per core
  (``Workload.busy``) predicted it 0.67x instead.
- Downpour's push and fetch have its next step to come back, and the α-β trip fitted well
  within it, so no wait was predicted; a worker waited 1.0-1.6 ms a step at 3 and 4 ranks,
  since MPI moves a message only inside the calls that test it (no progress thread).

So the calibration runs two patterns with the recipe's own training step as the workers' work
and the recipe's optimizer over each received gradient as the server's: the blocking one (the
asynchronous parameter server: a worker waits for the answer) and the overlapped one
(Downpour: a push and a fetch start after a step, with the worker's passes over its
gradient's bytes, and are waited for after the next). It keeps each pattern's mean worker
step; the blocking exchange's per-message link with the server's service taken out (two
message sizes, so a smaller message is costed too); the overlapped worker's pass and its
waits for the last push and the last fetch. The models add what the patterns do not fix: the
server's queue, Downpour's intervals, the copies of the blocking worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from meta.lv3.comm import tags
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import poll_all, poll_any, poll_barrier

WARMUP = 3  # rounds per worker left out: connections set up, caches warm
EXCHANGE, PUSH, FETCH = tags.ASYNC_PATTERN
# A Downpour worker's step passes over its n gradient bytes besides the optimizer's own: the
# pack and the accrued sum, the local move taken (copy, subtract) and added to the two logs of
# moves the servers have not seen; and per push the outbox copy, per fetch the landing
DOWNPOUR_PASSES = 6


@dataclass(frozen=True)
class AsyncPattern:
    """What ``measure_async_pattern`` found at ``ranks`` ranks (``ranks - 1`` workers): in the
    blocking pattern (the asynchronous parameter server: a worker waits for the server's
    answer) and in the overlapped one (Downpour: a worker's push and fetch run under its next
    step, and are waited for after it)."""

    ranks: int
    step_s: float  # blocking: a worker's training step between its exchanges (mean)
    link: Link  # blocking: per message of an exchange, the server's service taken out
    service_s: float  # blocking: the server's work per exchange of the full size (mean)
    overlapped_step_s: float  # overlapped: a worker's training step
    pass_s: float  # overlapped: one of its passes over the gradient's bytes (DOWNPOUR_PASSES)
    push_wait_s: float  # overlapped: the wait for the last push to be taken, per push
    fetch_wait_s: float  # overlapped: the wait for the last fetch's answer, per fetch

    def table(self) -> dict[str, float]:
        """Its figures by name, for a machine file (``from_table`` reads them back)."""
        out = {k: float(v) for k, v in vars(self).items() if k != "link"}
        out.update(link_alpha=self.link.alpha, link_beta=self.link.beta)
        return out

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> AsyncPattern:
        """Raises KeyError naming a missing figure."""
        return cls(int(table["ranks"]), float(table["step_s"]),
                   Link(float(table["link_alpha"]), float(table["link_beta"])),
                   float(table["service_s"]), float(table["overlapped_step_s"]),
                   float(table["pass_s"]), float(table["push_wait_s"]),
                   float(table["fetch_wait_s"]))

    def __str__(self) -> str:
        ms = 1e3
        return (f"asynchronous patterns at {self.ranks} ranks: blocking: worker step "
                f"{self.step_s * ms:.3f} ms, exchange {self.link}, server "
                f"{self.service_s * ms:.3f} ms; overlapped: worker step "
                f"{self.overlapped_step_s * ms:.3f} ms, a pass over its gradient "
                f"{self.pass_s * ms:.3f} ms, waits for a push "
                f"{self.push_wait_s * ms:.3f} ms and a fetch {self.fetch_wait_s * ms:.3f} ms")


def measure_async_pattern(comm: Any, step: Callable[[], None],
                          update: Callable[[np.ndarray], np.ndarray], count: int,
                          rounds: int = 20) -> AsyncPattern | None:
    """Every worker (ranks 0 to P-2) runs ``step`` and then exchanges a gradient of ``count``
    float32 values with the server (rank P-1), ``rounds`` times after ``WARMUP``: first
    blocking (alternately a quarter of them, so the link's beta is fitted), then overlapped.
    The server applies each gradient with ``update`` (the recipe's optimizer: it takes the
    flat gradient and returns the flat parameters) and copies the parameters back.
    Collective; every rank returns the same figures; None at size 1."""
    if comm.size < 2:
        return None
    server, workers = comm.size - 1, list(range(comm.size - 1))
    total = WARMUP + rounds
    sizes = (count, max(count // 4, 1))  # the blocking pattern's even and odd exchanges
    mine: list[Any] = []
    for overlapped in (False, True):
        poll_barrier(comm)
        if comm.rank == server:
            mine.append(_serve(comm, workers, total, sizes, update, overlapped))
        else:
            mine.append((_work_overlapped if overlapped else _work)(comm, server, total, sizes,
                                                                     step))
    gathered = comm.gather_obj(mine)
    figures = None
    if comm.rank == 0:
        figures = _figures(comm.size, sizes, [g for i, g in enumerate(gathered) if i != server],
                           gathered[server])
    return comm.bcast_obj(figures)


def _figures(ranks: int, sizes: tuple[int, int], workers: list, server: list) -> AsyncPattern:
    """The workers' and the server's records reduced to the pattern's figures."""
    def pooled(phase: int, key: int) -> list[float]:
        return [x for w in workers for x in w[phase][key]]

    service = server[0]
    per_message = [max((np.mean(pooled(0, 1 + k)) - np.mean(service[k])) / 2, 0.0)
                   for k in (0, 1)]
    big, small = sizes[0] * 4, sizes[1] * 4
    # (a network of fewer than 4 values sends one size only: no beta to fit)
    beta = max((per_message[0] - per_message[1]) / (big - small), 0.0) if big > small else 0.0
    alpha = max(per_message[1] - beta * small, 0.0)
    return AsyncPattern(ranks, float(np.mean(pooled(0, 0))), Link(float(alpha), float(beta)),
                        float(np.mean(service[0])), float(np.mean(pooled(1, 0))),
                        float(np.mean(pooled(1, 1))), float(np.mean(pooled(1, 2))),
                        float(np.mean(pooled(1, 3))))


def _work(comm: Any, server: int, total: int, sizes: tuple[int, int],
          step: Callable[[], None]) -> tuple[list[float], list[float], list[float]]:
    """A blocking worker: step, then send and receive (both nonblocking, polled, as
    ``AsyncParameterServer.step`` does). Its steps' seconds, and its exchanges' of either
    size."""
    grads, back = np.full(sizes[0], 1e-3, np.float32), np.empty(sizes[0], np.float32)
    steps: list[float] = []
    trips: tuple[list[float], list[float]] = ([], [])
    for i in range(total):
        start = time.perf_counter()
        step()
        middle = time.perf_counter()
        n = sizes[i % 2]
        poll_all(comm, [comm.isend(grads[:n], server, EXCHANGE),
                        comm.irecv(back[:n], server, EXCHANGE)])
        if i >= WARMUP:
            steps.append(middle - start)
            trips[i % 2].append(time.perf_counter() - middle)
    return steps, *trips


def _work_overlapped(comm: Any, server: int, total: int, sizes: tuple[int, int],
                     step: Callable[[], None]) -> tuple[list[float], ...]:
    """An overlapped worker, as Downpour's client pushes and fetches every step: step, pass
    over the gradient's bytes as it does (``DOWNPOUR_PASSES``), wait for the last push, push;
    wait for the last fetch's answer, fetch. Its steps' seconds, a pass's, and its two
    waits'."""
    grads, outbox = np.full(sizes[0], 1e-3, np.float32), np.empty(sizes[0], np.float32)
    # a pass each over its own buffer: the real passes go over as many arrays (the accrued
    # sum, the move, the two logs...), which a step's compute has pushed out of the caches
    logs = [np.zeros(sizes[0], np.float32) for _ in range(DOWNPOUR_PASSES)]
    back, empty = np.empty(sizes[0], np.float32), np.empty(0, np.float32)
    pushes: list[Any] = []
    fetches: list[Any] = []
    steps: list[float] = []
    passes: list[float] = []
    push_waits: list[float] = []
    fetch_waits: list[float] = []
    for i in range(total):
        start = time.perf_counter()
        step()
        stepped = time.perf_counter()
        for log in logs:
            log += grads
        passed = time.perf_counter()
        poll_all(comm, pushes)
        pushed = time.perf_counter()
        np.copyto(outbox, grads)
        pushes = [comm.isend(outbox, server, PUSH)]
        copied = time.perf_counter()
        poll_all(comm, fetches)
        fetched = time.perf_counter()
        fetches = [comm.irecv(back, server, FETCH), comm.isend(empty, server, FETCH)]
        if i >= WARMUP:
            steps.append(stepped - start)
            passes.append((passed - stepped) / DOWNPOUR_PASSES)
            push_waits.append(pushed - passed)
            fetch_waits.append(fetched - copied)
    poll_all(comm, pushes + fetches)
    return steps, passes, push_waits, fetch_waits


def _serve(comm: Any, workers: list[int], total: int, sizes: tuple[int, int],
           update: Callable[[np.ndarray], np.ndarray],
           overlapped: bool) -> tuple[list[float], list[float]]:
    """The server: each message as it comes. Blocking: the update and a copy of the
    parameters back (``AsyncParameterServer.serve``); overlapped: a push is applied so, a
    fetch answered with a copy of the parameters (Downpour's ``ShardServer``). Its seconds
    per blocking exchange of either size."""
    inboxes = [np.ones(sizes[0], np.float32) for _ in workers]
    outboxes = [np.empty(sizes[0], np.float32) for _ in workers]
    params: Any = None  # set by the first update: each worker pushes before it fetches
    receives = [comm.irecv(box, w) for box, w in zip(inboxes, workers)]
    sends: list[Any] = [None] * len(workers)
    expected = total * (2 if overlapped else 1)
    done = [0] * len(workers)
    service: tuple[list[float], list[float]] = ([], [])
    while min(done) < expected:
        i, tag = poll_any(comm, receives)
        start = time.perf_counter()
        n = sizes[done[i] % 2] if tag == EXCHANGE else sizes[0]
        if tag != FETCH:
            params = update(inboxes[i])
        if tag != PUSH:
            poll_all(comm, [sends[i]])
            np.copyto(outboxes[i][:n], params[:n])
            sends[i] = comm.isend(outboxes[i][:n], workers[i], tag)
        if tag == EXCHANGE and done[i] >= WARMUP:
            service[done[i] % 2].append(time.perf_counter() - start)
        done[i] += 1
        receives[i] = (comm.irecv(inboxes[i], workers[i]) if done[i] < expected
                       else comm.null_request())
    poll_all(comm, sends)
    return service
