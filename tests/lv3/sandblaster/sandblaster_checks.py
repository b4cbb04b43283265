"""MPI checks of Sandblaster L-BFGS (``meta.lv3.sandblaster.strategy``), written once.

pytest runs them in-process at size 1 (where Sandblaster runs the Level 2 L-BFGS); under MPI
every rank runs them as a script:

    mpiexec -n 3 python tests/lv3/sandblaster/sandblaster_checks.py [check_name ...]

At -n 3 there are 2 workers (the shard lives on the coordinator's rank); at -n 4 the agreement
check uses 2 shards (one on its own rank) and 2 workers, the straggler check 1 shard and 3
workers. Each check prints one ``sandblaster:`` line with what it measured.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv2.second_order import LBFGS
from meta.lv3 import Communicator, world
from meta.lv3.sandblaster.strategy import Evaluation, Sandblaster
from tests.checks import run_checks


class SoftmaxRows:
    """Softmax regression on rows of (x, y) at the current ``params`` (a ``RowsEvaluator``)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, params: dict[str, np.ndarray]) -> None:
        self.x, self.y, self.params, self.examples = x, y, params, len(x)

    def __call__(self, rows: np.ndarray) -> Evaluation:
        x, y = self.x[rows], self.y[rows]
        logits = x @ self.params["w"] + self.params["b"]
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        total = exp.sum(axis=1)
        loss_sum = float(np.sum(np.log(total) - logits[np.arange(len(y)), y]))
        p = exp / total[:, None]
        correct = int(np.count_nonzero(p.argmax(1) == y))
        p[np.arange(len(y)), y] -= 1.0
        return Evaluation(loss_sum, {"w": x.T @ p, "b": p.sum(axis=0)}, correct)

    def loss(self) -> float:
        return self(np.arange(self.examples)).loss_sum / self.examples


def problem(rows: int, features: int, classes: int, seed: int = 0):
    """Noisy labels of a random linear teacher (not separable: the optimum is finite)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)) / np.sqrt(features)
    scores = x @ rng.normal(size=(features, classes)) * 3 + rng.gumbel(size=(rows, classes))
    return x, scores.argmax(1)


def init(features: int, classes: int) -> dict[str, np.ndarray]:
    return {"w": np.zeros((features, classes)), "b": np.zeros(classes)}


def single_process_lbfgs(x, y, iterations: int) -> float:
    """Level 2's L-BFGS on the full batch: the loss after ``iterations``."""
    params = init(x.shape[1], int(y.max()) + 1)
    evaluate = SoftmaxRows(x, y, params)
    opt = LBFGS(params)

    def closure():
        loss_sum, grads, _ = evaluate(np.arange(len(x)))
        return loss_sum / len(x), {k: g / len(x) for k, g in grads.items()}

    for _ in range(iterations):
        opt.step(closure)
    return evaluate.loss()


def sandblaster_run(comm: Communicator, x, y, iterations: int, **options) -> tuple[Sandblaster,
                                                                                     float]:
    """Sandblaster on the full batch for ``iterations``; (strategy, final loss) on every rank."""
    params = init(x.shape[1], int(y.max()) + 1)
    evaluate = SoftmaxRows(x, y, params)
    opt = Sandblaster(LBFGS(params), comm, evaluate=evaluate, **options)
    if opt.role == "server":
        opt.serve()
    else:
        rows = np.arange(len(x))
        for _ in range(iterations):
            opt.step_rows(rows)
        opt.finish()
    return opt, evaluate.loss()


def check_agrees_with_single_process_lbfgs(comm: Communicator) -> None:
    """Same full-batch problem, same iterations: within 1 % of Level 2's L-BFGS."""
    x, y = problem(2000, 50, 5)
    iterations = 20
    reference = single_process_lbfgs(x, y, iterations)
    servers = 2 if comm.size >= 4 else 1
    opt, loss = sandblaster_run(comm, x, y, iterations, servers=servers, portions=8)
    start = SoftmaxRows(x, y, init(50, 5)).loss()
    assert loss < 0.8 * start, (loss, start)
    ratio = loss / reference
    assert abs(ratio - 1) < 0.01, (loss, reference)
    assert opt.iterations == iterations, opt.iterations
    if comm.size > 1:
        report = opt.report()
        assert report["portions_worker_0"] > 0 and report["portions_worker_1"] > 0, report
        assert report["shard_slices_added"] == 8 * report["evaluations"] * servers, report
    if comm.rank == 0:
        print(f"sandblaster: loss after {iterations} iterations {loss:.6f}, single-process "
              f"L-BFGS {reference:.6f}, ratio {ratio:.8f} ({len(opt.workers)} workers, "
              f"{servers} shards, {opt.lbfgs.evaluations} evaluations)", flush=True)


def _bookkeeping(opt: Sandblaster, portions: int) -> None:
    """First result wins: each portion counted once, every other copy discarded."""
    stats = opt.stats
    evaluations = len(stats.batch_times)
    assert stats.completed.sum() == portions * evaluations, (stats.completed, evaluations)
    assert stats.discarded.sum() == stats.backups_issued, (stats.discarded,
                                                           stats.backups_issued)
    assert opt.shard_stats[0] == portions * evaluations * len(opt.shard_ranks), opt.shard_stats
    assert opt.shard_stats[1] <= stats.backups_issued * len(opt.shard_ranks), opt.shard_stats


def check_straggler_takes_fewer_portions(comm: Communicator) -> None:
    """One worker twice as slow (it sleeps as long as it computed): it completes fewer
    portions, backups finish the batch, and the median batch time stays within 1.5x of runs
    without it. Runs alternate, so background load hits both alike."""
    if comm.size == 1:
        return
    x, y = problem(6000, 2500, 10, seed=1)
    portions, iterations = 16, 4
    equal: list[Sandblaster] = []
    slow: list[Sandblaster] = []
    losses = []
    for _ in range(4):
        for runs, options in ((equal, {}), (slow, {"slow_worker": 0, "slowdown": 2.0})):
            opt, loss = sandblaster_run(comm, x, y, iterations, portions=portions, **options)
            _bookkeeping(opt, portions)
            runs.append(opt)
            losses.append(loss)
    np.testing.assert_allclose(losses, losses[0], rtol=1e-6)  # backups change no result
    share = [sum(o.stats.completed for o in runs) for runs in (equal, slow)]
    share = [s / s.sum() for s in share]
    workers = len(share[0])
    others = (1 - share[1][0]) / (workers - 1)
    assert share[1][0] < share[0][0] and share[1][0] < others, share
    times = [np.median([t for o in runs for t in o.stats.batch_times]) for runs in (equal, slow)]
    ratio = times[1] / times[0]
    issued = sum(o.stats.backups_issued for o in slow)
    won = sum(o.stats.backups_won for o in slow)
    if comm.rank == 0:
        print(f"sandblaster: {workers} workers, {portions} portions; portion share equal "
              f"{np.round(share[0], 3).tolist()}, worker 0 slowed 2x "
              f"{np.round(share[1], 3).tolist()}; median batch {times[0] * 1e3:.1f} ms -> "
              f"{times[1] * 1e3:.1f} ms (ratio {ratio:.2f}); backups issued {issued}, won {won}",
              flush=True)
    assert ratio < 1.5, times
    assert issued > 0 and won > 0, (issued, won)


class MeanRows(SoftmaxRows):
    """As the workload's ``TrainingRows``: a mean loss times the rows, NaN for no rows."""

    def __call__(self, rows: np.ndarray) -> Evaluation:
        count = len(rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            total = super().__call__(rows)
            mean = np.float64(total.loss_sum) / count  # NaN for an empty portion
            grads = {k: g / count * count for k, g in total.grads.items()}
        return Evaluation(float(mean * count), grads, total.correct)


def check_more_portions_than_rows(comm: Communicator) -> None:
    """A batch of 5 rows cut into 16 portions: one portion per row, no empty ones (their
    NaN loss made the whole batch's loss NaN), the same loss as single-process L-BFGS."""
    x, y = problem(5, 4, 3)
    iterations = 3
    reference = single_process_lbfgs(x, y, iterations)
    params = init(4, 3)
    evaluate = MeanRows(x, y, params)
    opt = Sandblaster(LBFGS(params), comm, evaluate=evaluate, portions=16)
    if opt.role == "server":
        opt.serve()
    else:
        for _ in range(iterations):
            loss, _ = opt.step_rows(np.arange(len(x)))
            assert np.isfinite(loss), loss
        opt.finish()
    final = evaluate.loss()
    assert np.isfinite(final) and abs(final / reference - 1) < 1e-6, (final, reference)
    if comm.size > 1:
        report = opt.report()
        assert report["shard_slices_added"] == 5 * report["evaluations"], report
    if comm.rank == 0:
        print(f"sandblaster: 5 rows in 16 portions, loss {final:.6f} (single-process "
              f"{reference:.6f})", flush=True)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_agrees_with_single_process_lbfgs,
        check_straggler_takes_fewer_portions,
        check_more_portions_than_rows,
    )
}


def main(argv: list[str]) -> int:
    return run_checks(world(), CHECKS, argv or list(CHECKS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
