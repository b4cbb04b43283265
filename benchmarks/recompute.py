"""Activation recomputation on the planned executor: a GPT training step's memory and time
with ``recompute="blocks"`` against without (issue 43).

Run:  .venv/bin/python benchmarks/recompute.py [--layers 2 --width 128 --heads 4
          --context 256 --batch 32 --pairs 5 --json docs/results/recompute.json]

The model is recipes/shakespeare_gpt.py's (2 pre-LayerNorm blocks, width 128, 4 heads, 65
characters, head tied to the embedding, batch 32) at a context of 256. One process holds both
executors and:

* checks the gradients: every parameter's bit for bit, the tied embedding's largest
  difference (its two segments' parts are added in another order);
* reads the step activation memory: the plan's arena without recomputation; with it, the
  shared arena plus what the step holds outside it (the kept segment inputs, what is in flight
  between segments) -- ``peak_intermediate_bytes`` of each executor;
* times ``--pairs`` steps of each, interleaved (off, on, on, off, ...), after one warm-up
  step each: on a loaded machine the ratio of adjacent runs still means something, the
  times themselves do not. The load (``os.getloadavg``) is printed before and after. The
  process's CPU time per step (``time.process_time``, every thread) is given beside the wall
  time: on a machine shared with other work it varies far less, since time spent waiting for
  a core is not counted.

Then one subprocess per variant (``--worker``) builds the model, takes one step (it compiles
the plans), resets the kernel's high-water mark (``/proc/self/clear_refs``), takes two steps
and reports the RSS high-water mark of those steps less the RSS before the model was built
(numpy and meta's extensions loaded): parameters, gradients, the plans' arenas and kernels,
the step's temporaries, and the resident set after the steps. glibc's mmap
threshold is fixed at 64 KiB (``MALLOC_MMAP_THRESHOLD_``) so freed arrays go back to the system
and RSS reads what is held (as benchmarks/zero_memory.py does).
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

VARIANTS = ("off", "blocks")


def cpu_model() -> str:
    """The CPU's model name (meta.bench.environment's; imported late, as meta is here)."""
    from meta.bench.environment import cpu_model as model
    return model()


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _model(args):
    import numpy as np

    from meta.lv1 import gpt

    graph = gpt((args.context,), classes=65, layers=args.layers, heads=args.heads,
                width=args.width, seed=0)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.integers(0, 65, (args.batch, args.context)),
             "labels": rng.integers(0, 65, (args.batch, args.context))}
    return graph, feeds


def _executor(graph, variant: str):
    from meta.lv1.plan.executor import PlannedExecutor

    return PlannedExecutor(graph, recompute=None if variant == "off" else variant).train()


def worker(args) -> None:
    """One variant in a process of its own: RSS figures, one JSON line on stdout."""
    import numpy  # noqa: F401  (imported, and meta's extensions loaded, before the baseline)

    from meta.lv1 import gpt  # noqa: F401
    from meta.lv1.plan.runtime import module

    module()
    before = _status_kb("VmRSS")
    graph, feeds = _model(args)
    ex = _executor(graph, args.worker)
    ex.inference_and_backprop(feeds)  # compiles
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    for _ in range(2):
        ex.inference_and_backprop(feeds)
    print(json.dumps({"variant": args.worker, "step_hwm_mib": (_status_kb("VmHWM") - before)
                      / 1024, "rss_after_mib": (_status_kb("VmRSS") - before) / 1024,
                      "activation_mib": ex.peak_intermediate_bytes / 2**20}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of the kernels (0: as many as the machine has); at 1 the "
                        "CPU time per step is the work done, however loaded the machine")
    parser.add_argument("--json", default="", help="write the figures to this file")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        from meta.common.threads import set_threads

        set_threads(args.threads)
    if args.worker:
        worker(args)
        return
    import numpy as np

    load_before = os.getloadavg()
    print(f"machine: {cpu_model()}, {os.cpu_count()} logical CPUs; load average "
          f"{load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    print(f"GPT: {args.layers} layers, width {args.width}, {args.heads} heads, context "
          f"{args.context}, batch {args.batch}, float32, planned executor, "
          f"{args.threads or os.cpu_count()} thread(s)")
    graph, feeds = _model(args)
    executors = {v: _executor(graph, v) for v in VARIANTS}
    values, grads = {}, {}
    for v, ex in executors.items():  # warm-up: compiles the plans
        out, g = ex.inference_and_backprop(feeds)
        values[v], grads[v] = float(out["loss"]), {k: a.copy() for k, a in g.items()}
    identical = [k for k in grads["off"] if np.array_equal(grads["off"][k], grads["blocks"][k])]
    differ = {k: float(np.abs(grads["off"][k] - grads["blocks"][k]).max())
              for k in grads["off"] if k not in identical}
    segments = executors["blocks"].segments()
    memory = {v: ex.peak_intermediate_bytes / 2**20 for v, ex in executors.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(args.pairs):
        order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]
        for v in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            executors[v].inference_and_backprop(feeds)
            times[v].append(time.perf_counter() - start)
            cpu[v].append(time.process_time() - start_cpu)
    ratios = [b / a for a, b in zip(times["off"], times["blocks"])]
    cpu_ratio = statistics.median(cpu["blocks"]) / statistics.median(cpu["off"])
    load_after = os.getloadavg()
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    rss = {}
    for v in VARIANTS:
        cmd = [sys.executable, __file__, "--worker", v, "--layers", str(args.layers),
               "--width", str(args.width), "--heads", str(args.heads), "--context",
               str(args.context), "--batch", str(args.batch), "--threads", str(args.threads)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rss[v] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"recompute=blocks: {segments.how}")
    print(f"loss: off {values['off']:.7f}, blocks {values['blocks']:.7f}; gradients bit-identical "
          f"for {len(identical)} of {len(grads['off'])} parameters; others' largest "
          f"difference: {differ or 'none'}")
    print(f"{'':>8} {'arena MiB':>10} {'outside':>8} {'activation':>11} {'step RSS hwm':>13} "
          f"{'median s':>9} {'CPU s':>7}")
    for v, ex in executors.items():
        arena = segments.arena.nbytes if v == "blocks" else ex._last.arena_bytes
        outside = segments.kept_bytes if v == "blocks" else 0
        print(f"{v:>8} {arena / 2**20:>10.2f} {outside / 2**20:>8.2f} {memory[v]:>11.2f} "
              f"{rss[v]['step_hwm_mib']:>13.1f} {statistics.median(times[v]):>9.3f} "
              f"{statistics.median(cpu[v]):>7.3f}")
    mem_ratio = memory["blocks"] / memory["off"]
    rss_ratio = rss["blocks"]["step_hwm_mib"] / rss["off"]["step_hwm_mib"]
    time_ratio = statistics.median(ratios)
    print(f"activation memory ratio (blocks / off): {mem_ratio:.3f}; step RSS high-water ratio: "
          f"{rss_ratio:.3f}; step time ratio (median of {args.pairs} adjacent pairs): "
          f"{time_ratio:.3f} (pairs: {', '.join(f'{r:.2f}' for r in ratios)}); CPU time "
          f"ratio (medians): {cpu_ratio:.3f}")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json:
        result = {
            "benchmark": "benchmarks/recompute.py", "machine": cpu_model(),
            "logical_cpus": os.cpu_count(), "threads": args.threads or os.cpu_count(),
            "load_before": load_before, "load_after": load_after,
            "model": {"layers": args.layers, "width": args.width, "heads": args.heads,
                      "context": args.context, "batch": args.batch},
            "segments": segments.how, "loss": values,
            "gradients_identical": f"{len(identical)}/{len(grads['off'])}",
            "gradient_differences": differ,
            "activation_mib": memory, "arena_mib": {
                "off": executors["off"]._last.arena_bytes / 2**20,
                "blocks": segments.arena.nbytes / 2**20},
            "outside_arena_mib": segments.kept_bytes / 2**20,
            "activation_ratio": mem_ratio, "rss": rss, "rss_step_hwm_ratio": rss_ratio,
            "step_seconds": times, "time_ratio_median_of_pairs": time_ratio,
            "step_cpu_seconds": cpu, "cpu_time_ratio_of_medians": cpu_ratio,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
