"""Asynchronous strategies in virtual time: Downpour and the asynchronous parameter server with
N virtual workers inside one process (DistBelief's time-to-accuracy experiment on one machine).

Two halves, kept apart because a schedule does not depend on the numbers trained:

* ``schedule_downpour`` / ``schedule_async`` run a discrete-event simulation of the clocks
  alone: each worker's step takes the calibrated compute time (times a straggler factor from
  a seeded lognormal, and any fixed per-worker slowdown), messages cross α-β links, and the
  one server takes its messages in the order they arrive, one at a time, over one inbound and
  one outbound link (so at large N it is the bottleneck it was for DistBelief). The result is
  a ``Schedule``: the server's order of pushes and fetches with their simulated times, and
  for each worker the steps where its pending fetch had landed before its local step.
* ``execute_downpour`` (and ``meta.run.replay_workers.apply_in_order`` for the asynchronous parameter
  server) apply a schedule with real gradients: each virtual worker computes on its own data
  shard at its own, stale copy of the parameters, with the arithmetic of
  ``DownpourClient`` / ``ShardServer`` step for step, so a schedule recorded by a real run
  (``replay.json``'s ``schedule``) ends with that run's weights bit for bit.

``simulate`` joins them and evaluates the server's parameters on the test set at points of
simulated time: ``meta plan RECIPE --simulate 8,64,512``.

>>> t = Timing(compute_s=1.0, update_s=0.0, link=Link(0.0, 0.0))
>>> s = schedule_async(t, [2, 2], slow={1: 1.5})
>>> [(w, round(at, 2)) for w, _, at in s.server]
[(0, 1.0), (1, 1.5), (0, 2.0), (1, 3.0)]
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from meta.lv3.comm.costmodel import Link

PUSH, FETCH = 0, 1  # a message to the server (as ShardServer.events records them)
STRATEGIES = ("downpour", "async_parameter_server")


class SimulationError(ValueError):
    """A simulation that cannot run (names the option, file or worker)."""


@dataclass(frozen=True)
class Timing:
    """What the clocks are made of. ``compute_s``: one worker's forward and backward on its
    batch; ``update_s``: one optimizer step over all parameters (a worker's local step, the
    server's apply); ``copy_s``: the server's copy of the parameters into an answer;
    ``link``: worker to server; ``nbytes``: the parameters (a push, an answer).
    Stragglers: each step's compute time is multiplied by a lognormal factor of median 1
    (``sigma``; drawn from a generator seeded with (``seed``, worker)), and worker ``w`` by
    ``slow[w]`` throughout.

    ``servers``: Downpour's shards, taken to run in lockstep (each gets 1/servers of every
    message's bytes and of every update and copy, all in the same order), which is one
    server that many times faster: with an elementwise rule (SGD, momentum, Adagrad, Adam)
    the same numbers as one server applying that order."""

    compute_s: float
    update_s: float
    link: Link
    nbytes: int = 0
    copy_s: float = 0.0
    sigma: float = 0.0
    seed: int = 0
    servers: int = 1

    @property
    def message_bytes(self) -> float:
        """A push's or an answer's bytes on one shard's link."""
        return self.nbytes / self.servers

    def compute(self, slow: dict[int, float] | None = None) -> Callable[[int], Iterator[float]]:
        """Per worker, its steps' compute times (an endless iterator)."""
        slow = slow or {}

        def times(w: int) -> Iterator[float]:
            rng = np.random.default_rng([self.seed, w])
            base = self.compute_s * slow.get(w, 1.0)
            while True:
                yield base * (float(rng.lognormal(0.0, self.sigma)) if self.sigma else 1.0)

        return times


@dataclass
class Schedule:
    """What the timing decided: the server's messages in the order it handled them
    (worker index, PUSH or FETCH, simulated seconds), each worker's steps whose pending fetch
    landed before its local step (Downpour), and the strategy's intervals."""

    strategy: str
    workers: int
    server: list[tuple[int, int, float]]
    early: list[list[int]] = field(default_factory=list)
    n_fetch: int = 1
    n_push: int = 1
    warm_start_steps: int = 0
    finish_s: float = 0.0  # when the last worker finished (simulated)

    @property
    def order(self) -> list[int]:
        """The worker of each push the server applied."""
        return [w for w, tag, _ in self.server if tag == PUSH]

    @classmethod
    def from_record(cls, rec: dict[str, Any], where: Any) -> Schedule:
        """The schedule a real Downpour run recorded (``replay.json``'s ``schedule``)."""
        got = rec.get("schedule")
        keys = ("n_fetch", "n_push", "warm_start_steps", "server", "early")
        if not isinstance(got, dict) or any(k not in got for k in keys):
            raise SimulationError(f"{where}: no Downpour schedule recorded (a run with one "
                                  f"server, blocking_fetch off, in which every rank finished "
                                  f"records one: the replay follows the nonblocking client)")
        try:
            server = [(int(w), int(tag), float(t)) for w, tag, t in got["server"]]
            early = [[int(k) for k in steps] for steps in got["early"]]
        except (TypeError, ValueError) as err:
            raise SimulationError(f"{where}: field 'schedule' is damaged ({err})") from None
        return cls("downpour", len(rec["workers"]), server, early, int(got["n_fetch"]),
                   int(got["n_push"]), int(got["warm_start_steps"]),
                   max((t for _, _, t in server), default=0.0))


# -- the clocks ----------------------------------------------------------------------------

_WAIT = object()  # a worker waits for its fetch's answer
_GO = object()  # a worker waits for worker 0's warm start


class _Clocks:
    """The discrete-event core: a heap of (time, priority, seq) events; messages and answers
    (priority 0) come before a worker resuming at the same time (priority 1)."""

    def __init__(self, timing: Timing, n: int, answers_pushes: bool) -> None:
        self.t, self.n, self.now = timing, n, 0.0
        self.heap: list = []
        self.seq = itertools.count()
        self.inbound = self.outbound = self.cpu = 0.0  # when each is free again
        self.answer_at = [math.inf] * n  # the pending answer's arrival at each worker
        self.waiting = [False] * n
        self.go_at: float | None = None
        self.waiting_go: list[int] = []
        self.server: list[tuple[int, int, float]] = []
        self.answers_pushes = answers_pushes  # the async server answers every push
        self.gens: dict[int, Iterator] = {}

    def at(self, time: float, priority: int, what: str, w: int, tag: int = 0) -> None:
        heapq.heappush(self.heap, (time, priority, next(self.seq), what, w, tag))

    def send(self, w: int, tag: int) -> float:
        """Worker ``w`` sends at ``now``: latency, then the bytes over the server's inbound
        link (one message at a time, so a worker's messages stay in order as MPI keeps
        them). Returns when the transfer is done (a push's buffer is free again)."""
        link = self.t.link
        begin = max(self.now + link.alpha, self.inbound)
        self.inbound = begin + link.beta * (self.t.message_bytes if tag == PUSH else 0)
        self.at(self.inbound, 0, "arrive", w, tag)
        return self.inbound

    def _serve(self, w: int, tag: int) -> None:
        begin = max(self.now, self.cpu)
        self.server.append((w, tag, begin))
        self.cpu = begin + (self.t.update_s if tag == PUSH else self.t.copy_s) / self.t.servers
        if tag == FETCH or self.answers_pushes:
            link = self.t.link
            out = max(self.cpu, self.outbound)
            self.outbound = out + link.beta * self.t.message_bytes
            self.at(self.outbound + link.alpha, 0, "answer", w)

    def go(self) -> None:
        self.go_at = self.now + self.t.link.alpha
        for w in self.waiting_go:
            self.at(self.go_at, 1, "resume", w)

    def run(self, gens: dict[int, Iterator]) -> float:
        self.gens = gens
        for w in gens:
            self.at(0.0, 1, "resume", w)
        while self.heap:
            self.now, _, _, what, w, tag = heapq.heappop(self.heap)
            if what == "arrive":
                self._serve(w, tag)
            elif what == "answer":
                self.answer_at[w] = self.now
                if self.waiting[w]:
                    self.waiting[w] = False
                    self.at(self.now, 1, "resume", w)
            else:
                self._resume(w)
        return max(self.now, self.cpu)  # the last event, or the server's last update

    def _resume(self, w: int) -> None:
        try:
            got = next(self.gens[w])
        except StopIteration:
            return
        if got is _WAIT:
            if self.answer_at[w] <= self.now:  # already here
                self.at(self.now, 1, "resume", w)
            else:
                self.waiting[w] = True
        elif got is _GO:
            if self.go_at is not None:
                self.at(max(self.now, self.go_at), 1, "resume", w)
            else:
                self.waiting_go.append(w)
        else:
            self.at(float(got), 1, "resume", w)


def schedule_downpour(timing: Timing, steps: list[int], n_fetch: int = 1, n_push: int = 1,
                      warm_start_steps: int = 0, slow: dict[int, float] | None = None
                      ) -> Schedule:
    """Downpour's clocks: worker ``w`` runs ``steps[w]`` steps of ``DownpourClient.step``
    (gradient; the step-0 fetch, waited for; its pending fetch landed if the answer is
    there; the local update; a push every ``n_push`` steps, a fetch every ``n_fetch``, one
    still out then waited for), worker 0 first alone for ``warm_start_steps``."""
    for key, value, low in (("n_fetch", n_fetch, 1), ("n_push", n_push, 1),
                            ("warm_start_steps", warm_start_steps, 0)):
        if int(value) != value or value < low:
            raise SimulationError(f"virtual time: {key} must be an integer >= {low}, got "
                                  f"{value!r}")
    n = len(steps)
    if warm_start_steps and n > 1 and warm_start_steps > steps[0]:
        raise SimulationError(f"virtual time: warm_start_steps={warm_start_steps} is more "
                              f"than worker 0's {steps[0]} steps: the others would wait "
                              f"for it forever (--set distributed.warm_start_steps=...)")
    clocks = _Clocks(timing, n, answers_pushes=False)
    compute = timing.compute(slow)
    early: list[list[int]] = [[] for _ in range(n)]

    def worker(w: int) -> Iterator:
        times, pending, started, pushed = compute(w), False, False, 0.0

        def start_fetch() -> None:
            nonlocal pending
            clocks.answer_at[w] = math.inf
            clocks.send(w, FETCH)
            pending = True

        def await_fetch() -> Iterator:
            nonlocal pending
            if clocks.answer_at[w] > clocks.now:
                yield _WAIT
            pending = False

        def fetch_now() -> Iterator:
            if pending:
                yield from await_fetch()
            start_fetch()
            yield from await_fetch()

        if w != 0 and warm_start_steps:
            yield _GO
            yield from fetch_now()
            started = True
        for k in range(steps[w]):
            yield clocks.now + next(times)  # forward and backward
            if not started:
                yield from fetch_now()
                started = True
            if pending and clocks.answer_at[w] <= clocks.now:
                pending = False
                early[w].append(k)
            yield clocks.now + timing.update_s  # the local step
            done = k + 1
            if done % n_push == 0:
                if pushed > clocks.now:  # the previous push still holds the outbox
                    yield pushed
                pushed = clocks.send(w, PUSH)
            if done % n_fetch == 0:
                if pending:
                    yield from await_fetch()
                start_fetch()
            if w == 0 and done == warm_start_steps:
                yield from fetch_now()
                clocks.go()
        if steps[w] % n_push:
            if pushed > clocks.now:
                yield pushed
            clocks.send(w, PUSH)

    end = clocks.run({w: worker(w) for w in range(n)})
    return Schedule("downpour", n, clocks.server, early, n_fetch, n_push, warm_start_steps,
                    end)


def schedule_async(timing: Timing, steps: list[int], slow: dict[int, float] | None = None
                   ) -> Schedule:
    """The asynchronous parameter server's clocks: a worker computes its gradient, sends it,
    and waits for the parameters the server answers with once it has applied it."""
    n = len(steps)
    clocks = _Clocks(timing, n, answers_pushes=True)
    compute = timing.compute(slow)

    def worker(w: int) -> Iterator:
        times = compute(w)
        for _ in range(steps[w]):
            yield clocks.now + next(times)
            clocks.answer_at[w] = math.inf
            clocks.send(w, PUSH)
            yield _WAIT

    end = clocks.run({w: worker(w) for w in range(n)})
    return Schedule("async_parameter_server", n, clocks.server, finish_s=end)


# -- the numbers ---------------------------------------------------------------------------

class _Client:
    """One virtual Downpour worker's buffers (``DownpourClient``'s) and local optimizer."""

    def __init__(self, initial: np.ndarray, team: Any) -> None:
        from meta.lv2.optimizers import Optimizer
        from meta.lv3.flat import FlatBuffer

        self.flat = FlatBuffer(team.local.shapes, team.local.dtype)
        np.copyto(self.flat.buffer, initial)
        self.params = self.flat.buffer
        self.optimizer = Optimizer(team.transform, self.flat.views)
        self.accrued = np.zeros_like(initial)
        self.outbox = np.zeros_like(initial)
        self.fetched = np.zeros_like(initial)
        self.unpushed = np.zeros_like(initial)
        self.unfetched = np.zeros_like(initial)
        self.pending = False  # a fetch is out
        self.answered = False  # ... and the server has answered it


def execute_downpour(schedule: Schedule, team: Any,
                     on_push: Callable[[int, int, dict], None] | None = None,
                     on_event: Callable[[int, float, np.ndarray], None] | None = None,
                     where: Any = "the schedule") -> dict[str, np.ndarray]:
    """Apply a Downpour ``schedule`` with real gradients (``team``: ``meta.run.replay_workers.Workers``)
    and return the server's final parameters. Every worker runs ``DownpourClient.step``'s
    arithmetic; the server applies pushes and answers fetches in the schedule's order.
    ``on_push(i, worker, params)`` follows each applied push, ``on_event(j, time, flat)``
    each server message. A schedule the workers' steps cannot follow is a
    ``SimulationError`` naming the message."""
    from meta.lv2.optimizers import Optimizer

    workers = team.workers
    if schedule.workers != len(workers):
        raise SimulationError(f"{where}: the schedule has {schedule.workers} workers, the run "
                              f"{len(workers)}")
    server_flat = team.server()[1]
    values = server_flat.buffer
    server = Optimizer(team.transform, {"shard": values})  # ShardServer's: one flat shard
    clients = [_Client(values, team) for _ in workers]
    moved = np.zeros_like(values)
    queues: list[list[tuple[int, np.ndarray | None]]] = [[] for _ in workers]
    state = {"go": False}
    n_fetch, n_push, warm = schedule.n_fetch, schedule.n_push, schedule.warm_start_steps
    early = [set(e) for e in schedule.early] if schedule.early else [set() for _ in workers]

    def client(i: int) -> Iterator[None]:
        c, w = clients[i], workers[i]

        def land() -> None:
            if not c.answered:
                raise SimulationError(f"{where}: worker {w} lands a fetch the server has not "
                                      f"answered")
            np.add(c.fetched, c.unfetched, out=c.params)
            c.pending = c.answered = False

        def start_fetch() -> Iterator[None]:
            queues[i].append((FETCH, None))
            np.copyto(c.unfetched, c.unpushed)
            c.pending = True
            yield

        def fetch_now() -> Iterator[None]:
            if c.pending:
                land()
            yield from start_fetch()
            land()

        def push() -> Iterator[None]:
            np.copyto(c.outbox, c.accrued)
            c.accrued[:] = 0
            c.unpushed[:] = 0
            queues[i].append((PUSH, c.outbox))
            yield

        started = False
        if i != 0 and warm:
            if not state["go"]:
                raise SimulationError(f"{where}: worker {w} starts before worker "
                                      f"{workers[0]}'s warm start has ended")
            yield from fetch_now()
            started = True
        k = 0
        while True:
            grads = team.gradient(w, c.params)
            if grads is None:
                break
            if not started:
                grads = grads.copy()  # other workers compute while this one waits
                yield from fetch_now()
                started = True
            c.accrued += grads
            if c.pending and k in early[i]:
                land()
            np.copyto(moved, c.params)
            c.optimizer.step(team.grads.views if grads is team.grads.buffer
                             else _views(team.grads, grads))
            np.subtract(c.params, moved, out=moved)
            c.unpushed += moved
            if c.pending:
                c.unfetched += moved
            k += 1
            if k % n_push == 0:
                yield from push()
            if k % n_fetch == 0:
                if c.pending:
                    land()
                yield from start_fetch()
            if i == 0 and k == warm:
                yield from fetch_now()
                state["go"] = True
        if k % n_push:
            yield from push()

    gens = [client(i) for i in range(len(workers))]
    alive = [True] * len(workers)

    def advance(i: int, need: str) -> None:
        """Run worker ``i`` until it has sent a message (``need`` says why it must)."""
        while not queues[i]:
            if not alive[i]:
                raise SimulationError(f"{where}: {need}, but worker {workers[i]} has finished")
            if i != 0 and warm and not state["go"]:
                advance_go(need)
            try:
                next(gens[i])
            except StopIteration:
                alive[i] = False

    def advance_go(need: str) -> None:
        while not state["go"]:
            if queues[0] or not alive[0]:
                raise SimulationError(f"{where}: {need}, but worker {workers[0]}'s warm "
                                      f"start has not ended")
            try:
                next(gens[0])
            except StopIteration:
                alive[0] = False

    pushes = 0
    for j, (i, tag, at) in enumerate(schedule.server):
        if not 0 <= i < len(workers):
            raise SimulationError(f"{where}: message {j} names worker index {i}, the run has "
                                  f"{len(workers)} workers")
        advance(i, f"message {j} of the server is worker {workers[i]}'s")
        got, box = queues[i].pop(0)
        if got != tag:
            raise SimulationError(f"{where}: message {j} of the server is a "
                                  f"{'push' if tag == PUSH else 'fetch'} of worker "
                                  f"{workers[i]}, which sent a "
                                  f"{'push' if got == PUSH else 'fetch'}")
        if tag == PUSH:
            server.step({"shard": box})
            if on_push is not None:
                on_push(pushes, workers[i], server_flat.views)
            pushes += 1
        else:
            np.copyto(clients[i].fetched, values)
            clients[i].answered = True
        if on_event is not None:
            on_event(j, at, values)
    for i in range(len(workers)):  # the rest: local steps, and no message left unrecorded
        while alive[i]:
            try:
                next(gens[i])
            except StopIteration:
                alive[i] = False
            if any(tag == PUSH for tag, _ in queues[i]):
                raise SimulationError(f"{where}: worker {workers[i]} pushes after the "
                                      f"schedule's last message")
            queues[i].clear()
    return {k: np.array(v) for k, v in server_flat.views.items()}


def _views(like: Any, buffer: np.ndarray) -> dict[str, np.ndarray]:
    """``buffer`` seen with ``like``'s (a FlatBuffer's) names and shapes."""
    from meta.lv3.flat import FlatBuffer

    return FlatBuffer(like.shapes, like.dtype, buffer).views


# -- accuracy against simulated time -------------------------------------------------------

def staleness(schedule: Schedule) -> float:
    """The mean staleness of the applied pushes: the server's updates between a worker's
    last answer (fetch, or the async server's reply) and its push (``StalenessLog``'s)."""
    updates, answered, total, pushes = 0, [0] * schedule.workers, 0, 0
    replies = schedule.strategy == "async_parameter_server"
    for w, tag, _ in schedule.server:
        if tag == FETCH:
            answered[w] = updates
            continue
        total += updates - answered[w]
        pushes += 1
        updates += 1
        if replies:
            answered[w] = updates
    return total / max(pushes, 1)


@dataclass
class Curve:
    """One simulation: (simulated seconds, server updates, test loss, test accuracy) at each
    evaluated point, when the last worker finished, and the mean staleness."""

    strategy: str
    workers: int
    timing: Timing
    points: list[tuple[float, int, float, float]]
    finish_s: float
    staleness: float
    seconds: float = 0.0  # the simulation's own wall time


def timing_for(recipe: Any, machine: Any, workers: int, sigma: float = 0.0, seed: int = 0,
               compute_s: float | None = None) -> Timing:
    """The clocks of ``recipe`` on ``machine`` with ``workers`` workers and the recipe's
    Downpour servers (lockstep shards; 1 for the asynchronous parameter server): the
    planner's per-operator compute (measured by ``meta plan --calibrate`` where the machine
    has this recipe's costs, else estimated from its flop rate; ``compute_s`` overrides it,
    e.g. a measured step), the link of ``workers + servers`` ranks."""
    from meta.planner.workload import make_workload

    strategy = recipe.definitions.choices["distributed"]
    servers = int(strategy.values().get("servers", 1)) if strategy.name == "downpour" else 1
    work = make_workload(recipe, machine)
    nbytes, ranks = int(work.param_bytes), workers + servers
    return Timing(work.compute_s if compute_s is None else compute_s, work.update_s,
                  machine.sized(ranks).link(ranks), nbytes, machine.copy_beta * nbytes,
                  sigma, seed, servers)


def _team(recipe: Any, workers: int, folder: str) -> tuple[Any, list[int]]:
    """The virtual workers of ``recipe`` (worker w: data shard w of ``workers``) and each
    one's number of steps."""
    import io

    from meta.lv3 import SingleProcessCommunicator
    from meta.run.replay_workers import Workers
    from meta.run.runner import RecipeRun, make_sampler

    run = RecipeRun(recipe, SingleProcessCommunicator(), stream=io.StringIO(),
                    output_dir=Path(folder), progress=False, export_onnx=False)
    if getattr(run.model, "prepare", None) is not None:
        raise SimulationError(f"virtual time: model "
                              f"{recipe.definitions.choices['model'].name!r} pre-trains; the "
                              f"simulation covers the server's training updates only")
    d, train = recipe.definitions, run.trainer.train_data
    steps = [d.epochs * len(make_sampler(len(train), d, w, workers)) for w in range(workers)]
    return Workers(run, list(range(workers)), lambda w: (w, workers)), steps


def simulate(recipe: Any, workers: int, timing: Timing, points: int = 20,
             slow: dict[int, float] | None = None) -> Curve:
    """Train ``recipe`` (distributed ``downpour`` or ``async_parameter_server``) with
    ``workers`` virtual workers on ``timing``'s clocks; evaluate the server's parameters on
    the test set at ``points`` evenly spaced simulated times (and at 0)."""
    import tempfile
    import time

    strategy = recipe.definitions.choices["distributed"]
    if strategy.name not in STRATEGIES:
        raise SimulationError(f"virtual time: recipe {recipe.name!r} is distributed with "
                              f"{strategy.name!r}; it simulates {' and '.join(STRATEGIES)} "
                              f"(--set distributed=downpour)")
    if workers < 1:
        raise SimulationError(f"virtual time: the number of workers must be >= 1, got "
                              f"{workers}")
    opts = strategy.values()
    if strategy.name == "downpour" and opts.get("blocking_fetch"):
        raise SimulationError(f"virtual time: recipe {recipe.name!r} sets Downpour's "
                              f"blocking_fetch; the simulator follows the nonblocking client "
                              f"only (--set distributed.blocking_fetch=false to simulate that)")
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        team, steps = _team(recipe, workers, folder)
        if strategy.name == "downpour":
            schedule = schedule_downpour(timing, steps, int(opts.get("n_fetch", 1)),
                                         int(opts.get("n_push", 1)),
                                         int(opts.get("warm_start_steps", 0)), slow)
        else:
            schedule = schedule_async(timing, steps, slow)
        times = [t for _, _, t in schedule.server]
        marks = [schedule.finish_s * (p + 1) / points for p in range(points)]
        # after which server message each mark is evaluated (-1: before the first)
        after: dict[int, list[float]] = {}
        for m in marks:
            after.setdefault(int(np.searchsorted(times, m, side="right")) - 1, []).append(m)
        curve: list[tuple[float, int, float, float]] = []
        pushes = [0]

        def evaluate(at: float, flat: np.ndarray) -> None:
            got = team.evaluate(flat)
            curve.append((at, pushes[0], got["test_loss"], got["test_accuracy"]))

        initial = team.server()[1].buffer
        for m in [0.0] + after.get(-1, []):
            evaluate(m, initial)

        def on_event(j: int, at: float, flat: np.ndarray) -> None:
            if schedule.server[j][1] == PUSH:
                pushes[0] += 1
            for m in after.get(j, []):
                evaluate(m, flat)

        if strategy.name == "downpour":
            execute_downpour(schedule, team, on_event=on_event)
        else:
            from meta.run.replay_workers import apply_in_order

            def on_update(i: int, w: int, params: dict) -> None:
                on_event(i, times[i], np.concatenate([v.ravel() for v in params.values()]))

            apply_in_order(schedule.order, team, on_update)
    return Curve(strategy.name, workers, timing, curve, schedule.finish_s, staleness(schedule),
                 time.perf_counter() - begin)


def curve_table(curve: Curve) -> str:
    """One simulation as text: a header line and a row per evaluated point."""
    t = curve.timing
    lines = [f"N = {curve.workers} workers ({curve.strategy}, {t.servers} server"
             f"{'s' if t.servers > 1 else ''}): finished at "
             f"{curve.finish_s:.4g} s simulated, mean staleness {curve.staleness:.2f}, "
             f"compute {t.compute_s * 1e3:.3g} ms/step, lognormal sigma {t.sigma:g}, "
             f"simulated in {curve.seconds:.1f} s",
             f"  {'simulated s':>12} {'updates':>8} {'test loss':>10} {'test acc':>9}"]
    lines += [f"  {at:>12.4g} {n:>8} {loss:>10.4f} {acc:>9.4f}"
              for at, n, loss, acc in curve.points]
    return "\n".join(lines)


def draw_curves(ax: Any, curves: list[Curve], title: str) -> None:
    """Test accuracy against simulated wall time (log axis), one line per N, on ``ax``."""
    for c in curves:  # time 0 (the initial parameters) has no place on a log axis
        shown = [(at, acc) for at, _, _, acc in c.points if at > 0]
        ax.plot([at for at, _ in shown], [acc for _, acc in shown], marker=".",
                label=f"N = {c.workers}: ends at {c.finish_s:.3g} s, mean staleness "
                f"{c.staleness:.1f}")
    ax.set_xscale("log")
    ax.set_xlabel("simulated wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_curves(curves: list[Curve], path: str | Path, title: str) -> Path:
    """Test accuracy against simulated wall time, one line per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    draw_curves(ax, curves, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
