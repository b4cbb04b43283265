"""The hierarchical parameter server, neighbourhood averaging and Hogwild against allreduce.

Run:  .venv/bin/python benchmarks/catalogue_strategies.py [--epochs 4] [--json out.json]
      [--only hierarchy neighbours hogwild]

Each row is one ``mpiexec -n N meta run RECIPE`` of the MNIST MLP 784-256-128-10 (batch 64 per
training rank, same seed and epochs within a group), read back from its ``metrics.json``:
test accuracy, bytes this rank (0) hands to MPI per step, for the hierarchy the bytes the
global server received per step, and rank 0's ms per step (the sum of its timeline's phases:
compute, pack, communicate, update, unpack) as steps/s. Every group has an allreduce row with
the same training ranks. Bytes and accuracy do not depend on the machine's load; steps/s do:
the script prints how many cores other processes kept busy (``harness.OtherLoad``).
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

from harness import OtherLoad

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# (group, label, ranks, recipe, --set values)
RUNS = {
    "hierarchy": [  # 4 workers; the tree adds 1 server rank
        ("allreduce", 4, "mnist_allreduce", []),
        ("hierarchical_ps fan_in=1 (one level)", 5, "mnist_hierarchical_ps", ["fan_in=1"]),
        ("hierarchical_ps fan_in=2", 5, "mnist_hierarchical_ps", ["fan_in=2"]),
        ("hierarchical_ps fan_in=4", 5, "mnist_hierarchical_ps", ["fan_in=4"]),
    ],
    "neighbours": [  # 4 ranks, all training
        ("allreduce", 4, "mnist_allreduce", []),
        ("ring (point-to-point)", 4, "mnist_neighbours", ["distributed=ring"]),
        ("neighbours cart 1-D (ring)", 4, "mnist_neighbours", []),
        ("neighbours cart 2-D (2x2 torus)", 4, "mnist_neighbours", ["cart_dims=2"]),
        ("neighbours graph (exponential)", 4, "mnist_neighbours", ["topology=graph"]),
        ("neighbours cart 1-D, average_every=4", 4, "mnist_neighbours",
         ["average_every=4"]),
    ],
    "hogwild": [  # 2 training ranks; async_rma adds its window rank
        ("allreduce", 2, "mnist_allreduce", []),
        ("async_rma (locked window, +1 rank)", 3, "mnist_async_rma", []),
        ("hogwild (shared memory, unlocked)", 2, "mnist_hogwild", []),
    ],
}
PHASES = ("compute", "pack", "communicate", "update", "unpack")


class OtherThanRuns(OtherLoad):
    """``OtherLoad`` that counts the finished ``mpiexec`` runs (children) as this script's own."""

    def __enter__(self) -> OtherThanRuns:
        super().__enter__()
        self.children = _children_s()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        elapsed = time.perf_counter() - self.start
        self.cores = max(0.0, self.cores - (_children_s() - self.children) / elapsed)


def _children_s() -> float:
    own = os.times()
    return own.children_user + own.children_system


def run(ranks: int, recipe: str, sets: list[str], epochs: int, out: Path) -> dict:
    args = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "meta"), "run",
            str(REPO / "recipes" / f"{recipe}.py"), "--quiet", "--no-export",
            "--output-dir", str(out), f"--set=epochs={epochs}", "--set=batch_size=64",
            *(f"--set={s}" for s in sets)]
    done = subprocess.run(args, capture_output=True, text=True, env=os.environ)
    if done.returncode not in (0, 1) or not (out / "metrics.json").exists():
        # 1: a metric missed, still a figure; 2 (an error, e.g. a diverged loss): no figure
        errors = [line for line in done.stderr.splitlines() if line.startswith("meta: error")]
        return {"error": errors[0] if errors else
                f"exit {done.returncode}: {done.stdout[-300:]} {done.stderr[-300:]}"}
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    ms = sum(metrics.get(f"{p}_ms_per_step", 0.0) for p in PHASES)
    return {"test_accuracy": metrics["test_accuracy"],
            "bytes_sent_per_step": metrics["bytes_sent_per_step"],
            "global_server_bytes_per_step": metrics.get("global_server_bytes_per_step"),
            "replica_spread": metrics.get("replica_spread"),
            "steps_per_s": 1e3 / ms if ms else None,
            "train_time_s": metrics["train_time_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--only", nargs="*", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    with OtherThanRuns() as load, tempfile.TemporaryDirectory() as tmp:
        for group in args.only:
            results[group] = []
            for i, (label, ranks, recipe, sets) in enumerate(RUNS[group]):
                row = {"label": label, "ranks": ranks,
                       **run(ranks, recipe, sets, args.epochs, Path(tmp) / f"{group}{i}")}
                results[group].append(row)
                if "error" in row:
                    print(f"{group:<10} {label:<40} -n {ranks}  {row['error']}", flush=True)
                    continue
                gsb = row["global_server_bytes_per_step"]
                print(f"{group:<10} {label:<40} -n {ranks}  acc {row['test_accuracy']:.4f}  "
                      f"sent/step {row['bytes_sent_per_step']:>10.0f} B  "
                      + (f"server in/step {gsb:>9.0f} B  " if gsb is not None else "")
                      + f"{row['steps_per_s'] or 0:6.1f} steps/s  "
                      f"{row['train_time_s']:.1f} s", flush=True)
    print(f"meta: {load.describe()} (load average {os.getloadavg()[0]:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"epochs": args.epochs, "other_load_cores": load.cores,
                                         "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
