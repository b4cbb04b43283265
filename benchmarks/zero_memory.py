"""Memory per rank under ZeRO-2 and ZeRO-3 against allreduce: a ~22 M-parameter GPT under Adam.

Run:  python benchmarks/zero_memory.py [--ranks 4 --steps 3 --layers 7 --width 512]
                                       [--executor reference|planned] [--groups N]
                                       [--recompute]

For each strategy (allreduce without shared memory, zero2, zero3) it launches
``mpiexec -n RANKS`` of this file as workers. Each worker builds the GPT (7 blocks of width
512, 8 heads, a context of 64, 65 characters: 22.2 M parameters, float32), wraps Adam in the
strategy, takes one step (warm-up), resets the kernel's RSS high-water mark
(``/proc/self/clear_refs``), takes ``--steps`` steps of 2 blocks of 64 tokens and reads the
high-water mark (``VmHWM``) and, after the last step, the resident set (``VmRSS``). Both are
given less the worker's RSS before the model was built (interpreter, numpy, MPI, the batches):
the peak holds the parameters, gradients, Adam moments, the activations the backward keeps and
the update's temporaries; the resident set after a step is the model state alone (parameters,
gradients, moments, the strategy's buffers). Every strategy runs the executor ``--executor``
names (ZeRO-3's groups too), so activations are alike. On the planned executor the plans keep
their arenas (activations and the backward's temporaries) between steps: the resident set
then holds them too, so the workers also report the plans' arena bytes and the model state is
the resident set less them; ZeRO-3 reports its slots (the buffers its groups are gathered
into and their gradients written to: held during a step; on the planned executor they keep
their addresses between steps but give their pages back, so the resident set holds none).
ZeRO-2 on the planned executor runs as a recipe's does there: through ZeRO-3's groups with the parameters whole (``Zero2Grouped``).
``--recompute``: ZeRO-3 (and ZeRO-2 on the planned executor, which runs through its groups)
recomputes each group's forward before its backward and the planned groups share one arena
(allreduce runs without). The workers run with glibc's mmap threshold
fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``): by default glibc raises it after the first large
free, and arrays freed later stay in the heap, counted in RSS though free (ZeRO-3's freed
groups read 90 MB more). Prints per rank, the ratios of the ranks' means against allreduce's
and the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

STRATEGIES = ("allreduce", "zero2", "zero3")


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _arena_bytes(executors: list) -> int:
    """The plans' arenas (each counted once: plans may share one) and owned arrays."""
    from meta.lv1.plan.compiler import Plan

    arenas, owned = {}, 0
    for ex in executors:
        for plan in getattr(ex, "_plans", {}).values():
            if isinstance(plan, Plan):
                arenas[id(plan.arena)] = plan.arena.nbytes
                owned += plan.owned_bytes
    return sum(arenas.values()) + owned


def worker(name: str, steps: int, layers: int, width: int, kind: str, groups: int,
           recompute: bool) -> None:
    import numpy as np

    from meta.lv1 import PlannedExecutor, ReferenceExecutor, gpt
    from meta.lv2.optimizers import Optimizer, adam
    from meta.lv3 import world
    from meta.lv3.strategies import make_strategy

    comm = world()
    rng = np.random.default_rng(comm.rank)
    batches = [{"input": rng.integers(0, 65, (2, 64)), "labels": rng.integers(0, 65, (2, 64))}
               for _ in range(steps + 1)]
    before = _status_kb("VmRSS")
    graph = gpt((64,), classes=65, layers=layers, heads=8, width=width, seed=0)
    n = sum(p.size for p in graph.parameters.values())
    optimizer = Optimizer(adam(1e-3), graph.parameters)
    make = PlannedExecutor if kind == "planned" else ReferenceExecutor
    slots = 0
    if name == "zero3" or (name == "zero2" and kind == "planned"):
        from meta.lv3.data_parallel.zero3 import Zero2Grouped, Zero3

        # a recipe's zero2 on the planned executor runs through the groups (Zero2.from_recipe)
        cls = Zero3 if name == "zero3" else Zero2Grouped
        strategy = cls(optimizer, comm, graph, lambda g: make(g), groups=groups,
                       recompute="blocks" if recompute else None)
        executor = strategy.executor
        executors = executor.executors
        slots = executor.slot_bytes()
    else:
        options = {"shared_memory": False} if name == "allreduce" else {}
        strategy = make_strategy(name, optimizer, comm, **options)
        executor = make(graph)
        executors = [executor]
    executor.train()
    del graph, optimizer
    strategy.step_with(executor, batches[0])  # warm-up: the buffers exist from here on
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
    times = []
    for feeds in batches[1:]:
        comm.barrier()
        start = time.perf_counter()
        strategy.step_with(executor, feeds)
        times.append(time.perf_counter() - start)
    peak = _status_kb("VmHWM")
    resident = _status_kb("VmRSS")
    row = {"strategy": name, "rank": comm.rank, "ranks": comm.size, "parameters": int(n),
           "before_mb": before / 1024, "peak_mb": (peak - before) / 1024,
           "resident_mb": (resident - before) / 1024, "step_s": statistics.median(times),
           "arena_mb": _arena_bytes(executors) / 2**20, "slots_mb": slots / 2**20}
    rows = comm.gather_obj(row)
    if comm.is_root:
        for r in rows:
            print("ROW " + json.dumps(r), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=7)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--executor", choices=("reference", "planned"), default="reference",
                        help="the executor every strategy (and ZeRO-3's groups) runs")
    parser.add_argument("--groups", type=int, default=0,
                        help="ZeRO-3's layer groups (0: its default, one per 2 M parameters)")
    parser.add_argument("--recompute", action="store_true",
                        help="ZeRO-3 (and planned ZeRO-2, through its groups) recomputes each "
                        "group's forward before its backward (planned groups then share one "
                        "arena); allreduce runs without")
    parser.add_argument("--worker", choices=STRATEGIES)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.layers, args.width, args.executor, args.groups,
               args.recompute)
        return
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    results: dict[str, list[dict]] = {}
    for name in STRATEGIES:
        out = subprocess.run([str(mpiexec if mpiexec.exists() else "mpiexec"), "-n",
                              str(args.ranks), sys.executable, __file__, "--worker", name,
                              "--steps", str(args.steps), "--layers", str(args.layers),
                              "--width", str(args.width), "--executor", args.executor,
                              "--groups", str(args.groups),
                              *(["--recompute"] if args.recompute else [])],
                             env=env, capture_output=True, text=True, check=False)
        rows = [json.loads(line[4:]) for line in out.stdout.splitlines()
                if line.startswith("ROW ")]
        if out.returncode or not rows:
            sys.exit(f"{name}: the workers failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        results[name] = rows
    first = results[STRATEGIES[0]][0]
    print(f"GPT of {first['parameters'] / 1e6:.1f} M parameters, Adam, {args.ranks} ranks, "
          f"{args.steps} steps of 2 x 64 tokens, {args.executor} executor"
          f"{', ZeRO groups recomputing' if args.recompute else ''}, ZeRO-3 groups "
          f"{args.groups or 'default'}; load average "
          f"{os.getloadavg()[0]:.1f} (1 min) {os.getloadavg()[1]:.1f} (5 min) on "
          f"{os.cpu_count()} cores")
    print("MB above the worker's RSS before the model was built:")
    print(f"{'strategy':10} {'rank':>4} {'before MB':>10} {'peak MB':>9} {'resident MB':>12} "
          f"{'arenas MB':>10} {'slots MB':>9} {'step s':>7}")
    for name, rows in results.items():
        for r in rows:
            print(f"{name:10} {r['rank']:>4} {r['before_mb']:>10.1f} {r['peak_mb']:>9.1f} "
                  f"{r['resident_mb']:>12.1f} {r['arena_mb']:>10.1f} {r['slots_mb']:>9.1f} "
                  f"{r['step_s']:>7.2f}")

    def mean(name: str, key: str) -> float:
        if key == "state_mb":  # the resident set less the plans' arenas (activations)
            return statistics.mean(r["resident_mb"] - r["arena_mb"] for r in results[name])
        return statistics.mean(r[key] for r in results[name])

    base_step = statistics.median(r["step_s"] for r in results["allreduce"])
    for name in STRATEGIES[1:]:
        step = statistics.median(r["step_s"] for r in results[name])
        print(f"{name}: peak {mean(name, 'peak_mb'):.1f} MB per rank = "
              f"{mean(name, 'peak_mb') / mean('allreduce', 'peak_mb'):.2f}x allreduce's "
              f"{mean('allreduce', 'peak_mb'):.1f}; model state (resident after a step) "
              f"{mean(name, 'resident_mb'):.1f} MB = "
              f"{mean(name, 'resident_mb') / mean('allreduce', 'resident_mb'):.2f}x allreduce's "
              f"{mean('allreduce', 'resident_mb'):.1f}; without the plans' arenas "
              f"{mean(name, 'state_mb'):.1f} MB = "
              f"{mean(name, 'state_mb') / mean('allreduce', 'state_mb'):.2f}x allreduce's "
              f"{mean('allreduce', 'state_mb'):.1f}; step {step:.2f} s = "
              f"{step / base_step:.2f}x allreduce's {base_step:.2f} s")


if __name__ == "__main__":
    main()
