"""Stragglers under Downpour: does one slow worker slow the others down? (seed 001)

Run:  mpiexec -n 4 python benchmarks/straggler.py [--seconds 3 --features 512 --slowdown 5]

DistBelief's Downpour tolerates "variance in the processing speed of different model
replicas": a worker never waits for another, only for its own pushes and fetches. Here 1 shard
server and 3 workers fit a least-squares model (minibatches of ``--batch`` rows); every worker
trains for ``--seconds`` of wall time, twice: once all equal, once with the last worker made
``--slowdown`` times slower (after each step it sleeps ``slowdown - 1`` times that step's
compute time). The server timestamps every push it applies; a worker's update rate is its
applied pushes per second between its first and last push. The server prints each worker's
rate in both runs and the mean rate of the other workers with / without the straggler: their
ratio should not fall materially below 1. On an oversubscribed machine (4 ranks, 2 cores) it
may rise above 1: the sleeping straggler hands its core to the others.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Downpour, world


def least_squares(features: int, rows: int = 4096, outputs: int = 8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, features)) / np.sqrt(features)
    y = x @ rng.normal(size=(features, outputs))
    return x, y


def train(comm, x, y, args, straggler: int | None) -> dict[int, float] | None:
    """One timed run; on the server, applied pushes per second of each worker."""
    params = {"w": np.zeros((x.shape[1], y.shape[1]))}
    dp = Downpour(Optimizer(sgd(0.05), params), comm, server_rule=sgd(0.05))
    if dp.role == "server":
        dp.serve()
        rates = {}
        for worker in range(len(dp.workers)):
            times = [t for w, t in dp.server.arrivals if w == worker]
            rates[worker] = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
        return rates
    rng = np.random.default_rng(comm.rank)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        idx = rng.integers(0, len(x), args.batch)
        residual = x[idx] @ dp.params["w"] - y[idx]
        dp.step({"w": x[idx].T @ residual / args.batch})
        if comm.rank == straggler:
            time.sleep((args.slowdown - 1) * (time.perf_counter() - start))
    dp.finish()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--slowdown", type=float, default=5.0)
    args = parser.parse_args()
    comm = world()
    if comm.size < 3:
        raise SystemExit("straggler.py: run under mpiexec -n 4 (1 server, 3 workers)")
    x, y = least_squares(args.features)
    straggler = comm.size - 2  # the last worker
    equal = train(comm, x, y, args, None)
    slow = train(comm, x, y, args, straggler)
    if equal is None:
        return
    print(f"Downpour, 1 server + {len(equal)} workers, {args.seconds:g} s per run, worker "
          f"{straggler} {args.slowdown:g}x slower in the second run")
    print(f"{'worker':>8} {'equal (push/s)':>15} {'straggler run (push/s)':>23}")
    for w in equal:
        mark = "  <- straggler" if w == straggler else ""
        print(f"{w:>8} {equal[w]:>15.1f} {slow[w]:>23.1f}{mark}")
    others = [w for w in equal if w != straggler]
    before = np.mean([equal[w] for w in others])
    after = np.mean([slow[w] for w in others])
    print(f"others' mean rate: {before:.1f} -> {after:.1f} push/s, ratio {after / before:.2f}; "
          f"straggler's rate ratio {slow[straggler] / max(equal[straggler], 1e-9):.2f}")


if __name__ == "__main__":
    main()
