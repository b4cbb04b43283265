"""DistBelief's experiment on one machine: Downpour's test accuracy against simulated wall time
for N = 8, 64 and 512 virtual workers (meta.planner.virtual_time; issue 30, item 3).

Run:  python benchmarks/virtual_time.py [--workers 8,64,512 --servers 32 --sigma 0.2]
      (writes docs/results/virtual_time.png and docs/results/virtual_time.json; a few minutes on 2 cores)

The network is small on purpose, so the whole figure generates in minutes: an MLP 784-32-10
on MNIST (all 60,000 training images, one epoch, batch 32), Downpour with 32 server shards
(simulated in lockstep: one server 32 times faster), Adagrad (lr 0.01), fetch and push every
step, no warm start. Every worker computes real
gradients on its shard (at N = 512 that is 117 images, 4 steps); what is simulated is the
clocks: each step's compute time is this machine's, measured on the recipe (the planner's
calibration, ``meta.planner.calibrate.measure_recipe``), times a lognormal straggler factor
(median 1, ``--sigma``, seeded); messages cross the default machine description's
inter-node link (α = 5 µs, 12.5 GB/s), and the server takes them one at a time (its update
and copy are this machine's measured optimizer step and copy rate, over 32). The
total work is the same for every N (one epoch), so the curves show what more workers buy:
an earlier end, until the server's link and update rate are the bottleneck, and a staler
gradient at every push.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import textwrap
from dataclasses import replace
from pathlib import Path

RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": "mnist", "model": {"name": "mlp", "hidden": [32]},
             "optimizer": "adagrad"}
    MUTABLE = {"distributed": {"name": "downpour", "servers": 32, "n_fetch": 1,
                               "n_push": 1, "warm_start_steps": 0},
               "epochs": 1, "batch_size": 32, "lr": 0.01, "seed": 0}
    METRICS = {"test_accuracy": AtLeast(0.9)}
"""


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from meta.planner.calibrate import measure_recipe
    from meta.planner.machine import Machine
    from meta.planner.virtual_time import curve_table, draw_curves, simulate, timing_for
    from meta.run.recipe import load_recipe

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="8,64,512")
    ap.add_argument("--lrs", default="0.01,0.001", help="one panel per Adagrad rate")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--servers", type=int, default=32)
    ap.add_argument("--sigma", type=float, default=0.2)
    ap.add_argument("--points", type=int, default=24)
    ap.add_argument("--out", default="docs/results/virtual_time")
    args = ap.parse_args()
    lrs = [float(x) for x in args.lrs.split(",")]
    panels: list[tuple[float, list]] = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mnist_downpour_small.py"
        path.write_text(textwrap.dedent(RECIPE))
        base = load_recipe(str(path)).with_overrides(
            {"epochs": args.epochs, "distributed.servers": args.servers})
        costs = measure_recipe(base)  # the calibration: this machine's step of the network
        machine = replace(Machine(), name="default machine description",
                          costs={base.name: costs})
        for lr in lrs:
            recipe = base.with_overrides({"lr": lr})
            curves = []
            for n in [int(x) for x in args.workers.split(",")]:
                timing = timing_for(recipe, machine, n, args.sigma, seed=0)
                curves.append(simulate(recipe, n, timing, args.points))
                print(f"lr {lr:g}: " + curve_table(curves[-1]), flush=True)
            panels.append((lr, curves))
    t = panels[0][1][0].timing
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.4), sharey=True,
                             squeeze=False)
    for ax, (lr, curves) in zip(axes[0], panels):
        draw_curves(ax, curves, f"Adagrad lr {lr:g}")
    fig.suptitle(f"Downpour in virtual time: MLP 784-32-10, MNIST, {args.epochs} epoch(s) at "
                 f"batch 32; {t.servers} server shards; step {t.compute_s * 1e3:.2f} ms "
                 f"(measured here), lognormal stragglers sigma {args.sigma:g}", fontsize=10)
    fig.tight_layout()
    png = Path(args.out + ".png")
    fig.savefig(png, dpi=110)
    Path(args.out + ".json").write_text(json.dumps({
        "recipe": textwrap.dedent(RECIPE), "epochs": args.epochs, "sigma": args.sigma,
        "servers": t.servers,
        "compute_s": t.compute_s, "update_s": t.update_s, "copy_s": t.copy_s,
        "param_bytes": t.nbytes, "alpha_s": t.link.alpha, "beta_s_per_byte": t.link.beta,
        "curves": [{"lr": lr, "workers": c.workers, "finish_s": c.finish_s,
                    "staleness": c.staleness, "wall_s": c.seconds,
                    "points": [{"simulated_s": at, "updates": u, "test_loss": loss,
                                "test_accuracy": acc} for at, u, loss, acc in c.points]}
                   for lr, curves in panels for c in curves]}, indent=1) + "\n")
    print(f"wrote {png} and {args.out}.json")


if __name__ == "__main__":
    main()
