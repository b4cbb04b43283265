"""DBN strong scaling under MPI: the seed's "#Total Cores vs Time / Speed-up (Accuracy > 90%)"
experiment (seed 000, Tables 1 and 2) for ``recipes/mnist_dbn.py``, synchronous and asynchronous.

For each rank count P and strategy it launches ``mpiexec -n P meta run RECIPE --set
distributed=STRATEGY``:

- ``allreduce`` (synchronous): every rank takes a row shard of each global batch, CD statistics
  and fine-tuning gradients averaged by one allreduce per update;
- ``async_rma`` (asynchronous, the seed's scheme; or ``--async`` another parameter-server
  strategy): the last rank is a parameter server, the other P - 1 ranks are workers on fixed data
  shards that push each CD step (then each fine-tuning update) into the server's one-sided window
  and read the parameters back (``MPI_Accumulate`` / ``MPI_Get``).

One rank is one process for every strategy (nothing is distributed), so the 1-rank run is made
once and is every strategy's baseline. From ``metrics.json`` it takes the time to a test accuracy
as rank 0's pre-training time plus the fine-tuning epochs' times up to the first epoch that
reaches it (accuracy is measured after each epoch only: an upper bound at epoch resolution;
evaluation is left out, as the seed's times count training). Speed-up is T(1 rank) / T(P).

Each rank gets ``--threads`` BLAS/OpenMP threads (default 1: a rank is one core, as a task is in
the seed). Rank counts above the cores are marked ``*``: those ranks share cores, so they measure
contention, not scaling (an ``async_rma`` server sleeps, so its P - 1 workers are what compete).
The load average before and after each run is printed: on a shared machine the figures are only
comparable within one run of this script. ``--repeat N`` makes N rounds of all the runs and
tables the fastest of each configuration's N times (other processes only ever slow a run down).

    .venv/bin/python benchmarks/dbn_scaling.py                   # 1, 2, 4 ranks; ~4 min
    .venv/bin/python benchmarks/dbn_scaling.py --ranks 1,2 --set epochs=4 --out runs/dbn4
    .venv/bin/python benchmarks/dbn_scaling.py --docs --repeat 2 # docs/results/dbn_scaling.{png,md}

It prints the tables and writes ``OUT/scaling.json``, ``OUT/scaling.md`` and ``OUT/scaling.png``
(time and speed-up against ranks, one line per strategy and accuracy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from meta.common.threads import THREAD_VARIABLES, cores

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "results"
# (accuracy, whether reaching it counts, label): the seed asks > 90 %, the recipe >= 97 %.
THRESHOLDS = ((0.90, False, "> 90 %"), (0.97, True, ">= 97 %"))
# Two fine-tuning epochs more than the recipe's 4, so that runs whose larger global batch or
# staler updates need more iterations still reach 97 % (only the epochs up to it are counted).
DEFAULT_SETS = ("epochs=6",)
def load() -> float:
    """The 1-minute load average (NaN where the OS has none)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def workers(strategy: str, ranks: int) -> int:
    """Ranks that train under ``strategy`` (parameter servers do not)."""
    sys.path.insert(0, str(REPO))
    from meta.lv3 import replica  # pure arithmetic; no MPI

    return replica(strategy, 0, ranks)[1]


def time_to(history: list[dict[str, Any]], pretrain_s: float, accuracy: float,
            inclusive: bool) -> float | None:
    """Pre-training plus fine-tuning time until the first epoch whose test accuracy exceeds
    ``accuracy`` (or reaches it, if ``inclusive``); None if no epoch does."""
    elapsed = pretrain_s
    for epoch in history:
        elapsed += epoch["epoch_time_s"]
        acc = epoch.get("test_accuracy", 0.0)
        if acc > accuracy or (inclusive and acc == accuracy):
            return elapsed
    return None


def run_one(ranks: int, strategy: str, recipe: str, sets: list[str], out: Path,
            timeout: float, threads: int, round_: int = 0) -> dict[str, Any]:
    """One ``mpiexec -n ranks meta run``; its metrics.json digested (a failed recipe judgment
    still counts: the times are what we measure)."""
    name = f"{strategy}_ranks_{ranks}" if ranks > 1 else "ranks_1"
    name += f"_round_{round_ + 1}" if round_ else ""
    folder = out / name
    mpiexec = Path(sys.executable).parent / "mpiexec"
    meta = Path(sys.executable).parent / "meta"
    cmd = [str(mpiexec), "-n", str(ranks), str(meta), "run", recipe, "--output-dir", str(folder),
           "--quiet", "--no-export", "--set", f"distributed={strategy}",
           *(arg for s in sets for arg in ("--set", s))]
    env = dict(os.environ)
    if threads:
        env.update({v: str(threads) for v in THREAD_VARIABLES})
    load_before, start = load(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    wall, load_after = time.perf_counter() - start, load()
    (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
    report_path = folder / "metrics.json"
    if not report_path.exists():
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode} and wrote no "
                           f"{report_path}; output:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    report = json.loads(report_path.read_text())
    pretrain = report["metrics"].get("pretrain_time_s", 0.0)
    history = report["history"]
    return {"strategy": strategy if ranks > 1 else "one process", "ranks": ranks,
            "round": round_ + 1,
            "workers": workers(strategy, ranks), "oversubscribed": ranks > cores(),
            "load_before": load_before, "load_after": load_after, "wall_s": wall,
            "pretrain_s": pretrain, "final_accuracy": history[-1].get("test_accuracy"),
            "epochs": len(history), "passed": report["passed"],
            "accuracies": [e.get("test_accuracy") for e in history],
            **{f"time_{a:.2f}": time_to(history, pretrain, a, inc) for a, inc, _ in THRESHOLDS}}


def best(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (ranks, strategy): the shortest time to each accuracy over the rounds (not
    reached counts as infinite); the other fields from the round fastest to the first."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["ranks"], r["strategy"]), []).append(r)
    rows = []
    for group in groups.values():
        keys = [f"time_{a:.2f}" for a, _, _ in THRESHOLDS]
        row = dict(min(group, key=lambda r: r[keys[0]] or float("inf")))
        for key in keys:
            times = [r[key] for r in group if r[key] is not None]
            row[key] = min(times) if times else None
        row["rounds"] = len(group)
        rows.append(row)
    return rows


def _series(rows: list[dict[str, Any]], strategy: str) -> list[dict[str, Any]]:
    """The 1-rank baseline followed by ``strategy``'s runs."""
    return [r for r in rows if r["ranks"] == 1 or r["strategy"] == strategy]


def _strategies(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["strategy"] for r in rows if r["ranks"] > 1))


def tables(runs: list[dict[str, Any]]) -> str:
    """The seed's tables: ranks against time and speed-up, one per accuracy threshold, the
    strategies side by side (best over the rounds); then one line per run with its load."""
    rows = best(runs)
    rounds = max(r["rounds"] for r in rows)
    fastest = f", fastest of {rounds} rounds" if rounds > 1 else ""
    base = next((r for r in rows if r["ranks"] == 1), None)
    lines = []
    for accuracy, _, label in THRESHOLDS:
        key = f"time_{accuracy:.2f}"
        lines += [f"\nTime to test accuracy {label} (pre-training + fine-tuning epochs"
                  f"{fastest}), speed-up against 1 rank",
                  "| ranks | strategy | training ranks | time/s | speed-up |",
                  "|------:|:---------|---------------:|-------:|---------:|"]
        for r in sorted(rows, key=lambda r: (r["ranks"], r["strategy"])):
            mark = "*" if r["oversubscribed"] else ""
            t, t1 = r[key], base[key] if base else None
            speed = f"{t1 / t:.2f}" if t1 and t else "-"
            lines.append(f"| {r['ranks']}{mark} | {r['strategy']} | {r['workers']} | "
                         f"{f'{t:.1f}' if t else 'not reached'} | {speed} |")
    lines += ["\nPer run (load: 1-minute load average before -> after the run)",
              "| round | ranks | strategy | pre-training s | wall s | test accuracy per epoch, % "
              "| load |",
              "|------:|------:|:---------|---------------:|-------:|:---------------------------"
              "|-----:|"]
    for r in sorted(runs, key=lambda r: (r["ranks"], r["strategy"], r["round"])):
        mark = "*" if r["oversubscribed"] else ""
        accs = " ".join(f"{100 * a:.2f}" for a in r["accuracies"] if a is not None)
        lines.append(f"| {r['round']} | {r['ranks']}{mark} | {r['strategy']} | "
                     f"{r['pretrain_s']:.1f} | {r['wall_s']:.1f} | {accs} | "
                     f"{r['load_before']:.1f} -> {r['load_after']:.1f} |")
    if any(r["oversubscribed"] for r in rows):
        lines.append(f"\n* more ranks than the {cores()} cores: ranks share cores (contention, "
                     "not scaling)")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = best(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    styles = {"allreduce": "-", "async_rma": "--"}
    colors = {0.90: "tab:blue", 0.97: "tab:orange"}
    all_ranks = sorted({r["ranks"] for r in rows})
    for strategy in _strategies(rows):
        series = sorted(_series(rows, strategy), key=lambda r: r["ranks"])
        ranks = [r["ranks"] for r in series]
        for accuracy, _, label in THRESHOLDS:
            times = [r[f"time_{accuracy:.2f}"] for r in series]
            t1 = times[0] if ranks[0] == 1 else None
            style = dict(linestyle=styles.get(strategy, ":"), marker="o",
                         color=colors[accuracy], label=f"{strategy}, {label}")
            left.plot(ranks, [float("nan") if t is None else t for t in times], **style)
            right.plot(ranks, [float("nan") if not (t1 and t) else t1 / t for t in times],
                       **style)
    right.plot(all_ranks, all_ranks, "k:", label="linear")
    for ax, ylabel in ((left, "time to accuracy / s"), (right, "speed-up vs 1 rank")):
        ax.set_xlabel("MPI ranks (async: the last one is the parameter server)")
        ax.set_ylabel(ylabel)
        ax.set_xticks(all_ranks)
        ax.set_xticklabels([f"{p}*" if p > cores() else str(p) for p in all_ranks])
        if max(all_ranks) > cores():
            ax.axvspan(cores() + 0.5, max(all_ranks) + 0.5, color="0.9",
                       label="oversubscribed (*)")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(text: str, command: str, image: str) -> str:
    return (f"# DBN scaling: time to accuracy against MPI ranks (seed 000's tables)\n\n"
            f"Made by `.venv/bin/python {command}`; how it measures: the docstring of "
            f"`benchmarks/dbn_scaling.py`.\n\n```text\n{text}\n```\n\n"
            f"![time to accuracy and speed-up against ranks]({image})\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="recipes/mnist_dbn.py")
    parser.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    parser.add_argument("--sync", default="allreduce", help="the synchronous strategy")
    parser.add_argument("--async", dest="async_", default="async_rma",
                        help="the asynchronous strategy (async_rma, async_parameter_server, "
                             "downpour); 'none' to skip")
    parser.add_argument("--set", action="append", dest="sets", metavar="KEY=VALUE",
                        help=f"a MUTABLE override for every run (default: "
                             f"{' '.join(DEFAULT_SETS)})")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS/OpenMP threads per rank (0: meta's default, cores / ranks)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "dbn_scaling")
    parser.add_argument("--docs", action="store_true",
                        help="also copy the plot and tables to docs/results/dbn_scaling.{png,md}")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of all runs; the tables take each configuration's fastest")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per launch")
    args = parser.parse_args(argv)
    sets = list(DEFAULT_SETS) if args.sets is None else args.sets
    strategies = [s for s in (args.sync, args.async_) if s and s != "none"]
    args.out.mkdir(parents=True, exist_ok=True)
    threads = f"{args.threads} BLAS thread(s) per rank" if args.threads else \
        "meta's default threads (cores / ranks)"
    print(f"dbn_scaling: {cores()} cores, load average {load():.2f} at the start; figures are "
          "comparable only within one run of this script", flush=True)
    rows = []
    for round_ in range(args.repeat):
        for ranks in sorted(int(r) for r in args.ranks.split(",")):
            for strategy in strategies if ranks > 1 else strategies[:1]:
                print(f"dbn_scaling: round {round_ + 1}, {ranks} rank(s), "
                      f"{strategy if ranks > 1 else 'one process'}, load {load():.2f} ...",
                      flush=True)
                rows.append(run_one(ranks, strategy, args.recipe, sets, args.out, args.timeout,
                                    args.threads, round_))
    loads = [x for r in rows for x in (r["load_before"], r["load_after"])]
    header = (f"{args.recipe} with {' '.join(sets) or 'its own settings'}; "
              f"{', '.join(strategies)}; {cores()} cores, {threads}; {platform.node()} "
              f"{time.strftime('%Y-%m-%d %H:%M')}\nload average during the runs "
              f"{min(loads):.1f} to {max(loads):.1f} on {cores()} cores (other processes share "
              "them): compare figures within this run only")
    text = header + "\n" + tables(rows)
    print("\n" + text)
    (args.out / "scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
    command = " ".join(["benchmarks/dbn_scaling.py", *(argv if argv is not None else
                                                         sys.argv[1:])])
    (args.out / "scaling.md").write_text(markdown(text, command, "scaling.png"))
    title = (f"DBN ({args.recipe}) time to accuracy against MPI ranks; {cores()} cores, "
             f"{threads}, load {min(loads):.1f}-{max(loads):.1f}; * and shaded: oversubscribed")
    plot(rows, args.out / "scaling.png", title)
    written = [args.out / "scaling.json", args.out / "scaling.md", args.out / "scaling.png"]
    if args.docs:
        shutil.copyfile(args.out / "scaling.png", DOCS / "dbn_scaling.png")
        (DOCS / "dbn_scaling.md").write_text(markdown(text, command, "dbn_scaling.png"))
        written += [DOCS / "dbn_scaling.png", DOCS / "dbn_scaling.md"]
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
