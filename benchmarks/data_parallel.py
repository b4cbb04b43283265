"""Data-parallel efficiency: a training step under meta's allreduce strategy against the same
step with no communication, both run by the same ranks at the same time, one thread each.

    mpiexec -n 2 python benchmarks/data_parallel.py                     # MLP and LeNet-5
    mpiexec -n 2 python benchmarks/data_parallel.py --models mlp --json out.json

Every rank builds the model from the same seed and trains on its own synthetic batch (the
per-rank batch of the recipes: 128 for the MLP, 64 for LeNet-5). Blocks of ``--steps`` steps
alternate between the variants, ``--repeats`` of each:

- ``independent``: each rank steps its own replica (executor + optimizer, no message): what P
  separate single-process runs achieve on these cores together;
- ``allreduce``: the strategy as a recipe runs it: with every rank on one machine, the
  gradients summed in shared memory and each rank stepping 1/P of the parameters
  (``meta/lv3/data_parallel/node_exchange.py``);
- ``mpi``: the same strategy with ``shared_memory`` off, as across machines: MPI's allreduce
  (buckets started during the backward with ``overlap``) before the whole optimizer step.

Efficiency = median step time of ``independent`` / of ``allreduce`` (1 = communication free;
above 1 where sharing the update out saves more than the exchange costs), and the same for
``mpi``. Rank 0 prints both, the phase shares, and the α-β model's prediction of MPI's
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
from meta.common.files import write_text
from meta.lv2 import Optimizer, sgd
from meta.lv3 import Allreduce, world
from meta.lv3.comm.costmodel import measure_allreduce

MODELS = {"mlp": (lambda: lv1.mlp(seed=0), 128), "lenet5": (lambda: lv1.lenet5(seed=0), 64)}


class BarrierFirst(Allreduce):
    """The strategy with a barrier before its exchange, timed apart ("wait"): the measuring
    instrument for the transfer time alone."""

    def average(self, chunks, buffer) -> None:
        self.comm.barrier()
        self.timeline.lap("wait")
        super().average(chunks, buffer)


def runner(model: str, executor: str, comm, overlap: bool, kind=Allreduce,
           shared_memory: bool = False):
    graph = MODELS[model][0]()
    ex = lv1.EXECUTORS[executor](graph).train()
    optimizer = Optimizer(sgd(0.01, momentum=0.9), graph.parameters)
    strategy = kind(optimizer, comm, overlap=overlap, shared_memory=shared_memory) \
        if comm is not None else None
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
    shared, node = runner(model, args.executor, comm, False, shared_memory=True)
    together, strategy = runner(model, args.executor, comm, args.overlap)
    variants = {"independent": alone, "allreduce": shared, "mpi": together}
    for _ in range(args.warmup):
        for step in variants.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, step in variants.items():
            comm.barrier()
            times[name].append(block(step, args.steps))
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
    for variant in (strategy, node):  # each run's phases from a block of its own
        variant.timeline = type(variant.timeline)()
    block(together, args.steps)
    block(shared, args.steps)
    median = {k: statistics.median(v) for k, v in times.items()}
    comm_ms = summary.get("communicate", {}).get("per_step_s", 0.0) * 1e3
    return {"model": model, "ranks": comm.size, "executor": args.executor,
            "overlap": args.overlap, "ms_per_step": {k: v * 1e3 for k, v in median.items()},
            "seconds": times, "efficiency": median["independent"] / median["allreduce"],
            "shared_memory": node.node is not None,
            "shared_phases_ms_per_step": {k: v["per_step_s"] * 1e3
                                          for k, v in node.timeline.summary().items()},
            "mpi_efficiency": median["independent"] / median["mpi"],
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

            def phases(which: str, r: dict = r) -> str:
                return ", ".join(f"{k} {v:.2f}" for k, v in r[which].items())

            where = "shared memory" if r["shared_memory"] else "MPI (ranks on several machines)"
            print(f"{model} at {comm.size} ranks ({args.executor}): independent "
                  f"{ms['independent']:.2f} ms, allreduce through {where} {ms['allreduce']:.2f} "
                  f"ms per step: efficiency {r['efficiency']:.2f} (phases ms/step: "
                  f"{phases('shared_phases_ms_per_step')}); through MPI's allreduce, overlap "
                  f"{'on' if args.overlap else 'off'}: {ms['mpi']:.2f} ms, efficiency "
                  f"{r['mpi_efficiency']:.2f} (phases ms/step: "
                  f"{phases('overlapped_phases_ms_per_step')}); without overlap, after a "
                  f"barrier (waited {r['wait_ms']:.3f} ms): transfer measured "
                  f"{r['comm_measured_ms']:.3f} ms, α-β predicted {r['comm_predicted_ms']:.3f} "
                  f"ms ({r['bytes_per_step']:,} bytes)", flush=True)
    if comm.rank == 0 and args.json:
        write_text(args.json, json.dumps({"results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
