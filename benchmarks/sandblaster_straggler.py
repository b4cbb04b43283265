"""Stragglers under Sandblaster L-BFGS: portions per worker and batch times (seed 001).

Run:  mpiexec -n 3 python benchmarks/sandblaster_straggler.py [--slowdown 2 --portions 16]
      mpiexec -n 4 python benchmarks/sandblaster_straggler.py      (3 workers)

DistBelief's Sandblaster cuts each batch into many small portions handed out to whichever
worker is idle, so a slow replica simply takes fewer, and near the end of a batch issues backup
copies of the unfinished portions (the first result wins). Here full-batch softmax regression
(``--rows`` x ``--features``, 10 classes) runs ``--iterations`` L-BFGS iterations, in
alternating runs without and with worker 0 made ``--slowdown`` times slower (after each portion
it sleeps ``slowdown - 1`` times its compute time: no CPU, so on an oversubscribed machine the
others may even gain). Rank 0 prints the portions each worker completed, the backups issued
and won, and the median batch (evaluation) time of each condition; their ratio is taken from
the same launch. With W equal workers and one k times slower, perfect load balancing gives a
ratio of W / (W - 1 + 1/k): 1.33 for W=2, k=2; static equal shares would give k.
"""

from __future__ import annotations

import argparse

import numpy as np

from meta.lv2.second_order import LBFGS
from meta.lv3 import Sandblaster, world
from tests.lv3.sandblaster.sandblaster_checks import SoftmaxRows, init, problem


def run(comm, x, y, args, slow: bool) -> Sandblaster:
    params = init(x.shape[1], int(y.max()) + 1)
    options = {"slow_worker": 0, "slowdown": args.slowdown} if slow else {}
    opt = Sandblaster(LBFGS(params), comm, evaluate=SoftmaxRows(x, y, params),
                      portions=args.portions, **options)
    if opt.role == "server":
        opt.serve()
    else:
        for _ in range(args.iterations):
            opt.step_rows(np.arange(len(x)))
        opt.finish()
    return opt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--features", type=int, default=800)
    parser.add_argument("--portions", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--slowdown", type=float, default=2.0)
    args = parser.parse_args()
    comm = world()
    if comm.size < 3:
        raise SystemExit("sandblaster_straggler.py: run under mpiexec -n 3 or more")
    x, y = problem(args.rows, args.features, 10, seed=1)
    runs: dict[bool, list[Sandblaster]] = {False: [], True: []}
    for _ in range(args.repeats):
        for slow in (False, True):
            runs[slow].append(run(comm, x, y, args, slow))
    if comm.rank != 0:
        return
    workers = len(runs[False][0].workers)
    print(f"Sandblaster L-BFGS, {workers} workers, {args.portions} portions per batch, "
          f"{args.repeats} x {args.iterations} iterations per condition; worker 0 "
          f"{args.slowdown:g}x slower in the second")
    print(f"{'worker':>8} {'portions equal':>15} {'portions straggler':>19}")
    done = {slow: sum(o.stats.completed for o in opts) for slow, opts in runs.items()}
    for w in range(workers):
        mark = "  <- straggler" if w == 0 else ""
        print(f"{w:>8} {done[False][w]:>15} {done[True][w]:>19}{mark}")
    medians = {slow: float(np.median([t for o in opts for t in o.stats.batch_times]))
               for slow, opts in runs.items()}
    for slow, opts in runs.items():
        issued = sum(o.stats.backups_issued for o in opts)
        won = sum(o.stats.backups_won for o in opts)
        evaluations = sum(len(o.stats.batch_times) for o in opts)
        print(f"{'straggler' if slow else 'equal':>9}: {evaluations} batches, median "
              f"{medians[slow] * 1e3:.1f} ms; backups issued {issued}, won {won}")
    ideal = workers / (workers - 1 + 1 / args.slowdown)
    print(f"batch time ratio straggler / equal: {medians[True] / medians[False]:.2f} "
          f"(perfect balancing {ideal:.2f}, static shares {args.slowdown:.2f})")


if __name__ == "__main__":
    main()
