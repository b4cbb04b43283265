"""MPI checks of the asynchronous DistBelief-style strategies (``async_rma``, ``downpour``).

Written once (mpi4py's test style, as ``mpi_checks.py``): pytest runs them in-process at size 1;
under MPI every rank runs them as a script:

    mpiexec -n 3 python tests/lv3/parameter_server/distbelief_checks.py [check_name ...]

``DROPOUT_CHECKS`` (a worker leaves or goes silent) run one per launch: the worker that left
must take part in no collective afterwards, so no barrier follows them.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import AsyncRMA, Communicator, DistributedSampler, Downpour, MPICommunicator, world
from meta.lv3.comm.window import Window
from tests.checks import run_checks
from tests.lv3.mpi_checks import _assert_replicas_identical, _grads, _init, _loss, _problem


def check_rma_accumulates_every_update_exactly(comm: Communicator) -> None:
    # Integer-valued float updates: the window's sum is exact whatever the interleaving.
    opt = AsyncRMA(Optimizer(sgd(1.0), {"w": np.zeros(7), "b": np.zeros(2)}), comm)
    workers = max(comm.size - 1, 1)
    if opt.role == "server":
        opt.serve()
    else:
        for _ in range(25):
            opt.step({"w": np.full(7, -(comm.rank + 1.0)), "b": np.full(2, float(comm.rank))})
        opt.finish()
    np.testing.assert_array_equal(opt.params["w"], np.full(7, 25.0 * workers * (workers + 1) / 2))
    np.testing.assert_array_equal(opt.params["b"], np.full(2, -25.0 * workers * (workers - 1) / 2))
    _assert_replicas_identical(comm, opt.params)


def check_rma_window_read_and_add(comm: Communicator) -> None:
    if not isinstance(comm, MPICommunicator):
        return
    owner = comm.size - 1
    window = Window(comm, owner, 4, np.dtype(np.float64))
    if comm.rank == owner:
        window.write_local(np.arange(4.0))
    comm.barrier()
    out = np.empty(4)
    np.testing.assert_array_equal(window.read(out), np.arange(4.0))
    comm.barrier()
    window.add_and_read(np.ones(4), out)
    comm.barrier()
    np.testing.assert_array_equal(window.read(out), np.arange(4.0) + comm.size)
    comm.barrier()
    window.free()


def _train_downpour(comm: Communicator, **options) -> Downpour:
    x, y = _problem()
    dp = Downpour(Optimizer(sgd(0.05), _init(seed=7)), comm,
                  server_rule=sgd(0.05), **options)
    if dp.role == "server":
        dp.serve()
        return dp
    rank, size = Downpour.replica(comm.rank, comm.size, options.get("servers", 1))
    sampler = DistributedSampler(len(x), 4, rank=rank, size=size, seed=3)
    for epoch in range(12):
        sampler.set_epoch(epoch)
        for idx in sampler:
            dp.step(_grads(dp.params, x[idx], y[idx]))
    dp.finish()
    return dp


def check_downpour_converges(comm: Communicator) -> None:
    """Every run ends near the optimum (5.2e-5 of the initial loss at -n 3 and -n 4 on 2 loaded
    cores). Issue 8: workers that trained on without fresh parameters (before the servers
    served, or while a server was off the CPU) overshot, since the servers sum every walk;
    the loss then ended anywhere from 2e-3 to 7 times the initial one."""
    x, y = _problem()
    start = _loss(_init(seed=7), x, y)
    dp = _train_downpour(comm, servers=2 if comm.size >= 4 else 1, n_fetch=2, n_push=3)
    assert _loss(dp.params, x, y) < 1e-3 * start, (start, _loss(dp.params, x, y))


def check_downpour_every_shard_hears_every_worker(comm: Communicator) -> None:
    servers = 2 if comm.size >= 4 else 1
    x, y = _problem()
    start = _loss(_init(seed=7), x, y)
    dp = _train_downpour(comm, servers=servers, n_fetch=2, n_push=3)
    assert _loss(dp.params, x, y) < start, (start, _loss(dp.params, x, y))  # went downhill
    _assert_replicas_identical(comm, dp.params)
    if comm.size == 1:
        return
    workers = list(range(comm.size - servers))
    if dp.role == "server":
        assert set(dp.staleness.order) == set(workers), dp.staleness.order
    counts = dp.staleness.counts  # merged over the servers: the same on every rank
    assert counts.sum() > 0, counts
    assert (counts >= 0).all() and (dp.staleness.pushes > 0).all(), dp.staleness.pushes
    metrics = dp.report()
    assert metrics["pushes_applied"] == counts.sum() and metrics["staleness_mean"] >= 0, metrics


def check_downpour_warm_start(comm: Communicator) -> None:
    k = 6
    dp = _train_downpour(comm, servers=1, n_fetch=1, n_push=1, warm_start_steps=k)
    if dp.role == "server":
        order = dp.staleness.order
        assert order[:k] == [0] * k, order[: 2 * k]  # only worker 0 during the warm start
        assert set(order[k:]) == set(range(comm.size - 1)), order


def check_downpour_blocking_fetch(comm: Communicator) -> None:
    """``blocking_fetch``: after every step a worker holds exactly the servers' answer to the
    fetch it asked right after that step's push (no fetch left pending, none landing early),
    and the run still converges (issue 39: the GPT's gradients one fetch fresher)."""
    x, y = _problem()
    start = _loss(_init(seed=7), x, y)
    servers = 2 if comm.size >= 4 else 1
    dp = Downpour(Optimizer(sgd(0.05), _init(seed=7)), comm, server_rule=sgd(0.05),
                  servers=servers, n_fetch=1, n_push=1, blocking_fetch=True)
    if dp.role == "server":
        dp.serve()
    else:
        rank, size = Downpour.replica(comm.rank, comm.size, servers)
        sampler = DistributedSampler(len(x), 4, rank=rank, size=size, seed=3)
        for epoch in range(12):
            sampler.set_epoch(epoch)
            for idx in sampler:
                dp.step(_grads(dp.params, x[idx], y[idx]))
                if dp.servers:  # the answer as is: its own push is in it, nothing unpushed
                    assert not dp.client.fetches, dp.client.steps
                    np.testing.assert_array_equal(dp.flat_params.buffer, dp.client.fetched)
        if dp.servers:
            assert dp.client.early == [], dp.client.early
        dp.finish()
    assert _loss(dp.params, x, y) < 1e-3 * start, (start, _loss(dp.params, x, y))
    _assert_replicas_identical(comm, dp.params)
    assert dp.schedule is None  # no schedule the simulator would replay wrongly


def _dropout_run(comm: Communicator, drop: Callable[[Downpour, int], None],
                 **options) -> tuple[Downpour, int]:
    """Downpour (2 shard servers from 4 ranks) whose last worker runs ``drop(dp, step)`` before
    each of its 40 planned steps; returns the strategy and the dropping worker's rank."""
    servers = 2 if comm.size >= 4 else 1
    x, y = _problem()
    dp = Downpour(Optimizer(sgd(0.05), _init(seed=7)), comm, servers=servers,
                  server_rule=sgd(0.05), **options)
    dropper = comm.size - servers - 1 if comm.size > 1 else -1
    if dp.role == "server":
        dp.serve()
        return dp, dropper
    rank, size = Downpour.replica(comm.rank, comm.size, servers)
    rows = np.arange(rank, len(x), size)
    for step in range(40):
        if comm.rank == dropper:
            drop(dp, step)
            if dp.left:
                return dp, dropper
        idx = rows[(4 * step + np.arange(4)) % len(rows)]
        dp.step(_grads(dp.params, x[idx], y[idx]))
    dp.finish()
    return dp, dropper


def _assert_survivors_trained(comm: Communicator, dp: Downpour, dropper: int) -> None:
    x, y = _problem()
    assert _loss(dp.params, x, y) < 0.5 * _loss(_init(seed=7), x, y)
    survivors = dp.end_comm
    assert survivors.size == comm.size - (comm.size > 1), survivors
    _assert_replicas_identical(survivors, dp.params)


def check_downpour_worker_leaves_early(comm: Communicator) -> None:
    def leave_at_10(dp: Downpour, step: int) -> None:
        if step == 10:
            dp.leave(planned_steps=40)

    dp, dropper = _dropout_run(comm, leave_at_10)
    if comm.rank == dropper:
        assert dp.left and not dp.lost
        return  # no collective after leaving
    _assert_survivors_trained(comm, dp, dropper)
    if comm.size == 1:
        return
    assert dp.departures() == [f"worker {dropper} left after 10 of 40 steps; its remaining 30 "
                               "steps on its shard of data were not trained"], dp.departures()
    metrics = dp.report()
    assert (metrics["workers_left"], metrics["workers_lost"]) == (1, 0), metrics
    assert dp.staleness.pushes[dropper] == 10 * len(dp.servers), dp.staleness.pushes
    assert f"meta: worker {dropper} left after 10" in dp.report_text()


def check_downpour_silent_worker_is_declared_lost(comm: Communicator) -> None:
    timeout = 0.5

    def stall_at_10(dp: Downpour, step: int) -> None:
        if step == 10:
            time.sleep(4 * timeout)  # alive but silent: the servers give up on it

    dp, dropper = _dropout_run(comm, stall_at_10, worker_timeout_s=timeout)
    if comm.rank == dropper:
        assert dp.lost and not dp.left  # it came back and learnt it had been dropped
        return
    _assert_survivors_trained(comm, dp, dropper)
    if comm.size == 1:
        return
    (line,) = dp.departures()
    assert line.startswith(f"worker {dropper} lost: silent for ") and "timeout 0.5 s" in line
    assert dp.report()["workers_lost"] == 1 and dp.staleness.pushes[dropper] > 0


def check_downpour_lost_worker_that_leaves_returns(comm: Communicator) -> None:
    """A worker declared lost, back for one step (its fetch request goes unanswered), then
    leaving: leave() returns once the verdict says it was lost (it used to wait for that fetch
    forever)."""
    timeout = 0.5

    def stall_then_leave(dp: Downpour, step: int) -> None:
        if step == 10:
            time.sleep(4 * timeout)
        if step == 11:
            dp.leave(planned_steps=40)

    dp, dropper = _dropout_run(comm, stall_then_leave, worker_timeout_s=timeout)
    if comm.rank == dropper:
        assert dp.left and dp.lost
        return
    _assert_survivors_trained(comm, dp, dropper)
    if comm.size == 1:
        return
    (line,) = dp.departures()
    assert line.startswith(f"worker {dropper} lost: silent for "), line


DROPOUT_CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_downpour_worker_leaves_early,
        check_downpour_silent_worker_is_declared_lost,
        check_downpour_lost_worker_that_leaves_returns,
    )
}

CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_rma_accumulates_every_update_exactly,
        check_rma_window_read_and_add,
        check_downpour_every_shard_hears_every_worker,
        check_downpour_warm_start,
        check_downpour_blocking_fetch,
    )
}
# Run one per launch, each under a test of its own (issue 8: it used to fail intermittently).
CONVERGENCE_CHECKS: dict[str, Callable[[Communicator], None]] = {
    "downpour_converges": check_downpour_converges,
}


def main(argv: list[str]) -> int:
    # Dropout and convergence checks end with ranks that left: no barrier after them.
    return run_checks(world(), {**CHECKS, **DROPOUT_CHECKS, **CONVERGENCE_CHECKS},
                      argv or list(CHECKS), barrier_after=lambda name: name in CHECKS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
