"""Data-parallel efficiency: a training step under meta's allreduce strategy against the same
step with no communication, both run by the same ranks at the same time, one thread each.

    mpiexec -n 2 python benchmarks/data_parallel.py                     # MLP and LeNet-5
    mpiexec -n 2 python benchmarks/data_parallel.py --models mlp --json out.json

Every rank builds the model from the same seed and trains on its own synthetic batch (the
per-rank batch of the recipes: 128 for the MLP, 64 for LeNet-5). Blocks of ``--steps`` steps
alternate between the two variants, ``--repeats`` of each:

- ``independent``: each rank steps its own replica (executor + optimizer, no message): what P
  separate single-process runs achieve on these cores together;
- ``allreduce``: the strategy averages the gradients (one fused allreduce, or buckets started
  during the backward with ``overlap``) before the same optimizer step.

Efficiency = median step time of ``independent`` / of ``allreduce`` (1 = communication free).
Rank 0 prints it, the strategy's phase shares, and its α-β model's prediction of the
communication time per step next to the measured one; the link is calibrated on the call the
strategy makes (allreduces of the sizes it sends: ``costmodel.measure_allreduce``). The
measured time for that comparison comes from a further block without overlap and with a
barrier before each exchange, which splits the exchange into the wait for the slower rank
(load imbalance, which no link model predicts) and the transfer itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from meta import lv1
from meta.files import write_text
from meta.lv2 import Optimizer, sgd
from meta.lv3 import Allreduce, world
from meta.lv3.costmodel import measure_allreduce

MODELS = {"mlp": (lambda: lv1.mlp(seed=0), 128), "lenet5": (lambda: lv1.lenet5(seed=0), 64)}


class BarrierFirst(Allreduce):
    """The strategy with a barrier before its exchange, timed apart ("wait"): the measuring
    instrument for the transfer time alone."""

    def average(self, chunks, buffer) -> None:
        self.comm.barrier()
        self.timeline.lap("wait")
        super().average(chunks, buffer)


def runner(model: str, executor: str, comm, overlap: bool, kind=Allreduce):
    graph = MODELS[model][0]()
    ex = lv1.EXECUTORS[executor](graph).train()
    optimizer = Optimizer(sgd(0.01, momentum=0.9), graph.parameters)
    strategy = kind(optimizer, comm, overlap=overlap) if comm is not None else None
    batch = MODELS[model][1]
    rng = np.random.default_rng(comm.rank if comm is not None else 0)
    feeds = {"input": rng.standard_normal((batch, 1, 28, 28), dtype=np.float32),
             "labels": rng.integers(0, 10, batch)}

    def step() -> None:
        if strategy is not None:
            strategy.step_with(ex, feeds)
        else:
            _, grads = ex.inference_and_backprop(feeds)
            optimizer.step(grads)
    return step, strategy


def block(step, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def measure(model: str, args, comm) -> dict:
    alone, _ = runner(model, args.executor, None, False)
    together, strategy = runner(model, args.executor, comm, args.overlap)
    for _ in range(args.warmup):
        alone(), together()
    times: dict[str, list[float]] = {"independent": [], "allreduce": []}
    for _ in range(args.repeats):
        comm.barrier()
        times["independent"].append(block(alone, args.steps))
        comm.barrier()
        times["allreduce"].append(block(together, args.steps))
    # the transfer alone, for the α-β comparison
    timed, split = runner(model, args.executor, comm, False, BarrierFirst)
    for _ in range(args.warmup):
        timed()
    split.timeline = type(split.timeline)()
    block(timed, args.steps)
    summary = split.timeline.summary()
    # around the sizes the strategy sends: MPI changes protocol with the size, so one line
    # through all sizes misses a given one (LeNet-5's 247 KB by 4x); fit it where it is used
    sizes = sorted({int(c.nbytes * f) for c in split.grad_chunks for f in (0.5, 0.75, 1, 1.5)})
    link = measure_allreduce(comm, sizes)
    strategy.timeline = type(strategy.timeline)()  # the overlapped run's phases: a clean block
    block(together, args.steps)
    median = {k: statistics.median(v) for k, v in times.items()}
    comm_ms = summary.get("communicate", {}).get("per_step_s", 0.0) * 1e3
    return {"model": model, "ranks": comm.size, "executor": args.executor,
            "overlap": args.overlap, "ms_per_step": {k: v * 1e3 for k, v in median.items()},
            "seconds": times, "efficiency": median["independent"] / median["allreduce"],
            "phases_ms_per_step": {k: v["per_step_s"] * 1e3 for k, v in summary.items()},
            "overlapped_phases_ms_per_step": {
                k: v["per_step_s"] * 1e3 for k, v in strategy.timeline.summary().items()},
            "comm_measured_ms": comm_ms,
            "wait_ms": summary.get("wait", {}).get("per_step_s", 0.0) * 1e3,
            "comm_predicted_ms": split.predict_comm_s(link) * 1e3,
            "link": {"alpha_s": link.alpha, "beta_s_per_byte": link.beta},
            "bytes_per_step": strategy.flat_grads.nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mlp,lenet5")
    parser.add_argument("--executor", default="planned")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--no-overlap", dest="overlap", action="store_false",
                        help="average after the backward instead of during it")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    comm = world()
    results = []
    for model in args.models.split(","):
        r = measure(model, args, comm)
        results.append(r)
        if comm.rank == 0:
            ms = r["ms_per_step"]
            phases = ", ".join(f"{k} {v:.2f}"
                               for k, v in r["overlapped_phases_ms_per_step"].items())
            print(f"{model} at {comm.size} ranks ({args.executor}, overlap "
                  f"{'on' if args.overlap else 'off'}): independent {ms['independent']:.2f} ms, "
                  f"allreduce {ms['allreduce']:.2f} ms per step: efficiency "
                  f"{r['efficiency']:.2f}; phases ms/step: {phases}; without overlap, after a "
                  f"barrier (waited {r['wait_ms']:.3f} ms): transfer measured "
                  f"{r['comm_measured_ms']:.3f} ms, α-β predicted {r['comm_predicted_ms']:.3f} "
                  f"ms ({r['bytes_per_step']:,} bytes)", flush=True)
    if comm.rank == 0 and args.json:
        write_text(args.json, json.dumps({"results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
