"""`meta plan`'s memory per rank against the measured high-water mark (issue 43).

Run:  python benchmarks/memory_validation.py [--ranks 2,4 --steps 3 --layers 4 --width 256]
      [--json docs/results/memory_validation.json]

The recipe is ``recipes/shakespeare_gpt.py`` with its model made ``--layers`` blocks of width
``--width`` (written to a temporary recipe file, which the planner and the measured runs both
read; the default 4 x 256 is a GPT of 3.2 M parameters whose model state and activations are of
one size, so neither hides the other's error). For each P it asks the planner
(``meta.planner.costs.rank_configurations``, what ``meta plan`` ranks) for its configurations,
keeps allreduce (``distributed.shared_memory=false``), ZeRO-1 (allreduce in shared memory),
ZeRO-2 and ZeRO-3 (with and without recomputation, where the planner offers it) and runs each
one's own ``--set`` lines under ``mpiexec -n P`` of this file as workers.

What is measured (the same thing the planner predicts, ``meta.planner.memory``): a rank's
resident set at the peak of a training step, above what the process held before the model was
built. Each worker imports meta, loads the recipe's data, reads its ``VmRSS`` (the baseline),
then builds the model, executor, optimizer and strategy as ``meta run`` does
(``meta.run.runner.RecipeRun._build``, ``distribute``), takes one step (warm-up: the plan is
compiled, the optimizer's state and the strategy's buffers are written), resets the kernel's
high-water mark (``/proc/self/clear_refs``), takes ``--steps`` steps and reads ``VmHWM``. The
measured figure is that high-water mark less the baseline: parameters, gradients, optimizer
state, the step's activations and every buffer and temporary alive at once, whoever allocated
them. The compile's one-time trace (before the reset) is not in it: ``ru_maxrss`` less the
baseline, which includes it (``VmHWM`` read before the reset), is printed beside it. Workers run with glibc's default
allocator settings, as ``meta run``. Prints the table (configuration, predicted MB, measured MB
(the ranks' largest), error) and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20
BOUND = 0.15  # the acceptance's bound on the model error
# the planner's configurations validated: (strategy, label prefix); recompute rows follow them
WANTED = (("allreduce", "allreduce overlapped"), ("allreduce", "allreduce ZeRO-1"),
          ("zero2", "ZeRO-2"), ("zero3", "ZeRO-3"))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def write_recipe(folder: Path, layers: int, width: int, heads: int) -> Path:
    """``shakespeare_gpt`` with its model resized, as a recipe file of its own."""
    from meta.lv1.plan.executor import PlannedExecutor

    path = folder / "memory_gpt.py"
    # recompute settable where the planned executor takes it (the planner's recompute rows)
    recompute = ", 'recompute': ''" if "recompute" in PlannedExecutor.options else ""
    path.write_text(
        f"import runpy\n"
        f"_base = runpy.run_path({str(ROOT / 'recipes' / 'shakespeare_gpt.py')!r})\n"
        f"FIXED = {{**_base['FIXED'], 'model': {{'name': 'gpt', 'layers': {layers}, "
        f"'heads': {heads}, 'width': {width}}}, 'events': []}}\n"
        f"MUTABLE = {{**_base['MUTABLE'], 'dataset.train_samples': 256{recompute}}}\n"
        f"METRICS = _base['METRICS']\n")
    return path


def worker(recipe_path: str, sets: dict[str, str], steps: int) -> None:
    import numpy as np

    from meta.lv1 import build_model
    from meta.lv1.plan.executor import PlannedExecutor  # noqa: F401  (imported before the baseline)
    from meta.lv2 import build_dataset, build_optimizer
    from meta.lv2.dataset_registry import classes
    from meta.lv3 import world
    from meta.lv3.workload import Workload
    from meta.lv2.dataset_registry import model_dtype
    from meta.run.data_and_model import io_names
    from meta.run.recipe import load_recipe

    comm = world()
    recipe = load_recipe(recipe_path).with_overrides(sets)
    d = recipe.definitions
    data, model = d.choices["dataset"], d.choices["model"]
    train, test, _augment = build_dataset(data.component, data.options, d.seed)
    batches = [feeds_for_rank(train, d.batch_size, comm.rank, i) for i in range(steps + 1)]
    before = _status_kb("VmRSS")
    # as RecipeRun._build and distribute build them (without the trainer, its events and
    # the evaluation, which a training step does not touch)
    graph = build_model(model.component, model.options, train.inputs.shape[1:],
                        classes(train, test), d.seed, model_dtype(train))
    graph = getattr(graph, "graph", graph)
    executor = d.choices["executor"].build(graph)
    opt = d.choices["optimizer"]
    optimizer = build_optimizer(opt.component, opt.options, graph.parameters, 100, d.epochs)
    workload = Workload(executor, io_names(graph), train, int(d.batch_size), d.seed, False, 100)
    strategy = d.choices["distributed"].build(optimizer, comm, workload)
    names = io_names(graph)
    feeds = [{names["input"]: x, "labels": y} for x, y in batches]
    executor.train()
    strategy.step_with(executor, feeds[0])  # warm-up: plan compiled, state and buffers written
    arena = getattr(strategy, "executor", executor)
    arena_bytes = float(getattr(arena, "peak_intermediate_bytes", 0) or 0)
    plan = getattr(arena, "_last", None)
    owned_bytes = float(getattr(plan, "owned_bytes", 0) or 0)
    warm = _status_kb("VmHWM")  # the build's and the first step's (the plan's compile)
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
    start = time.perf_counter()
    for f in feeds[1:]:
        strategy.step_with(executor, f)
    step_s = (time.perf_counter() - start) / max(1, steps)
    peak = _status_kb("VmHWM")
    resident = _status_kb("VmRSS")
    finish = getattr(strategy, "finish", None)
    row = {"rank": comm.rank, "before_mb": before / 1024, "peak_mb": (peak - before) / 1024,
           "resident_mb": (resident - before) / 1024, "with_compile_mb": (max(warm, peak) - before) / 1024,
           "arena_mb": arena_bytes / MB, "owned_mb": owned_bytes / MB, "step_s": step_s,
           "parameters": int(sum(np.asarray(p).size for p in graph.parameters.values()))}
    rows = comm.gather_obj(row)
    if finish is not None:
        finish()
    if comm.is_root:
        print("ROWS " + json.dumps(rows), flush=True)


def feeds_for_rank(train, batch: int, rank: int, step: int):
    """This rank's ``step``-th batch of the training data (inputs, labels)."""
    import numpy as np

    lo = ((rank * 7 + step) * batch) % max(1, len(train) - batch)
    return train.batch(np.arange(lo, lo + batch))


def predictions(recipe_path: Path, ranks: int, sets: dict[str, str]) -> list:
    """The planner's configurations at ``ranks`` for the recipe, as ``meta plan`` ranks them."""
    from meta.planner.costs import rank_configurations
    from meta.planner.machine import Machine
    from meta.planner.workload import make_workload
    from meta.run.recipe import load_recipe

    recipe = load_recipe(str(recipe_path)).with_overrides(sets)
    machine = Machine(cores=os.cpu_count() or 1).oversubscribed(ranks)  # all ranks here
    return rank_configurations(make_workload(recipe, machine), machine, ranks)


def chosen(preds: list) -> list:
    """The validated configurations among the planner's, in ``WANTED``'s order."""
    out = []
    for strategy, prefix in WANTED:
        out += [p for p in preds if p.strategy == strategy and p.label.startswith(prefix)]
    return out


def run_config(recipe_path: Path, ranks: int, sets: dict[str, str], steps: int,
               malloc: str = "default") -> list[dict]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    if malloc == "fixed":  # glibc gives every array of 64 KiB and more back when freed
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run([str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(ranks),
                          sys.executable, __file__, "--worker", str(recipe_path),
                          "--sets", json.dumps(sets), "--steps", str(steps)],
                         env=env, capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("ROWS "):
            return json.loads(line[5:])
    sys.exit(f"{sets}: the workers failed (exit {out.returncode}):\n{out.stderr[-3000:]}")


def cpu_model() -> str:
    """The CPU's model name (meta.bench.environment's; imported late, as meta is here)."""
    from meta.bench.environment import cpu_model as model
    return model()


def machine_line() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="P values, comma-separated")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--only", default="", help="only the configurations whose label contains one of these (comma-separated)")
    parser.add_argument("--verbose", action="store_true", help="each rank's figures")
    parser.add_argument("--malloc", choices=("default", "fixed"), default="default",
                        help="glibc's allocator as meta run has it, or with its mmap "
                        "threshold fixed at 64 KiB (freed arrays leave the resident set)")
    parser.add_argument("--also-default", action="store_true", help="with --malloc fixed: "
                        "each configuration measured again with glibc's defaults")
    parser.add_argument("--json", metavar="OUT", help="write the rows here")
    parser.add_argument("--markdown", metavar="OUT", help="write the table here")
    parser.add_argument("--worker", metavar="RECIPE", help=argparse.SUPPRESS)
    parser.add_argument("--sets", default="{}", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, json.loads(args.sets), args.steps)
        return
    folder = Path(tempfile.mkdtemp(prefix="memory_validation_"))
    recipe_path = write_recipe(folder, args.layers, args.width, args.heads)
    base = {"batch_size": str(args.batch)}
    rows = []
    print(f"GPT {args.layers} x {args.width}, batch {args.batch} of 64 characters, AdamW; "
          f"{machine_line()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    header = (f"{'P':>2} {'configuration':44} {'predicted MB':>12} {'measured MB':>11} "
              f"{'error':>7} {'with compile MB':>15}  predicted parts MB")
    print(header, flush=True)
    for ranks in [int(r) for r in args.ranks.split(",")]:
        for pr in chosen(predictions(recipe_path, ranks, base)):
            if args.only and not any(w in pr.label for w in args.only.split(",")):
                continue
            sets = {**base, **pr.sets}
            measured = run_config(recipe_path, ranks, sets, args.steps, args.malloc)
            worst = max(measured, key=lambda r: r["peak_mb"])
            predicted = pr.memory.total / MB
            error = predicted / worst["peak_mb"] - 1
            row = {"recipe": "shakespeare_gpt", "layers": args.layers, "width": args.width,
                   "batch": args.batch, "ranks": ranks, "configuration": pr.label,
                   "sets": sets, "malloc": args.malloc, "predicted_mb": round(predicted, 2),
                   "predicted_parts_mb": pr.memory.parts_mb(),
                   "measured_mb": round(worst["peak_mb"], 2), "error": round(error, 4),
                   "within": abs(error) <= BOUND,
                   "with_compile_mb": round(worst["with_compile_mb"], 2),
                   "ranks_measured": measured}
            if args.also_default:  # the same run under glibc's default allocator settings
                again = run_config(recipe_path, ranks, sets, args.steps, "default")
                top = max(r["peak_mb"] for r in again)
                row.update(default_mb=round(top, 2), default_error=round(predicted / top - 1, 4),
                           default_ranks=again)
            row.update(machine=machine_line(), load=round(os.getloadavg()[0], 2),
                       date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            rows.append(row)
            extra = (f"  (glibc default: {row['default_mb']:.1f} MB, "
                     f"{row['default_error']:+.1%})" if args.also_default else "")
            print(f"{ranks:>2} {pr.label:44} {predicted:>12.1f} {worst['peak_mb']:>11.1f} "
                  f"{error:>+7.1%} {worst['with_compile_mb']:>15.1f}  "
                  f"{pr.memory.parts_mb()}{'' if row['within'] else '  BEYOND'}{extra}",
                  flush=True)
            if args.verbose:
                for r in measured:
                    print("   ", {k: round(v, 2) if isinstance(v, float) else v
                                  for k, v in r.items()}, flush=True)
    within = sum(r["within"] for r in rows)
    print(f"{within} of {len(rows)} rows within ±{BOUND:.0%}; load average "
          f"{os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, args))
        print(f"wrote {args.markdown}")


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    """The table for docs/results: one row per configuration and P."""
    within = sum(r["within"] for r in rows)
    defaults = [r for r in rows if "default_error" in r]
    default_within = (f"; {sum(abs(r['default_error']) <= BOUND for r in defaults)} of "
                      f"{len(defaults)} with glibc's defaults" if defaults else "")
    head = rows[0] if rows else {}
    lines = [
        "# `meta plan`'s memory per rank against the measured high-water mark", "",
        f"Produced by `python benchmarks/memory_validation.py --ranks {args.ranks} --steps "
        f"{args.steps} --malloc {args.malloc}{' --also-default' if args.also_default else ''}"
        f"` on {head.get('machine', '?')}, {head.get('date', '?')} (load average "
        f"{min(r['load'] for r in rows) if rows else 0:.1f} to "
        f"{max(r['load'] for r in rows) if rows else 0:.1f}; memory does not depend on it).",
        "",
        f"The GPT of `recipes/shakespeare_gpt.py` made {args.layers} blocks of width "
        f"{args.width} ({head.get('ranks_measured', [{}])[0].get('parameters', 0) / 1e6:.1f} M "
        f"parameters), AdamW with clipping, batch {args.batch} of 64 characters per rank, the "
        f"planned executor. Measured: each rank's `VmHWM` over {args.steps} training steps "
        f"after a warm-up step, less its `VmRSS` before the model was built; the largest "
        f"rank's; glibc's mmap threshold {'fixed at 64 KiB (a freed array leaves the resident set: the resident set is what is live)' if args.malloc == 'fixed' else 'as meta run has it'}"
        f"{'; again with glibc defaults (freed arrays of up to 32 MB may stay in its heap, resident)' if args.also_default else ''}. "
        f"First step: the high-water mark including the warm-up step (the plan's compile). "
        f"Predicted: `meta plan`'s MB/rank for the same configuration (its --set "
        f"lines ran), parts params+grads+state+activations+buffers+temporaries+runtime (the "
        f"process's own beyond its arrays, measured at the planner's first probe: "
        f"`meta.planner.memory.runtime_bytes`). "
        f"**{within} of {len(rows)} rows within ±{BOUND:.0%}"
        f"{default_within}.**", "",
        "| P | configuration | predicted MB | measured MB | error | glibc default MB | its "
        "error | first step MB | predicted parts MB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        flag = "" if r["within"] else " (beyond)"
        default = (f"{r['default_mb']:.1f} | {r['default_error']:+.1%}"
                   f"{'' if abs(r['default_error']) <= BOUND else ' (beyond)'}"
                   if "default_mb" in r else "- | -")
        lines.append(f"| {r['ranks']} | {r['configuration']} | {r['predicted_mb']:.1f} | "
                     f"{r['measured_mb']:.1f} | {r['error']:+.1%}{flag} | {default} | "
                     f"{r['with_compile_mb']:.1f} | {r['predicted_parts_mb']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
