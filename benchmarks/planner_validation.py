"""``meta plan`` against measurement: predicted and measured step times of the strategies
at the ranks this machine runs (item 4 of issue 30, the part that runs here).

    mpiexec -n 2 python benchmarks/planner_validation.py     # allreduce rows at P = 2 (also 3, 4)
    python benchmarks/planner_validation.py --pipelines      # pipelines of 2 and 4 stages
    python benchmarks/planner_validation.py --asynchronous   # Downpour, asynchronous PS
    python benchmarks/planner_validation.py --two-nodes      # allreduce on two emulated nodes

Each writes its rows into docs/results/planner_validation.md (and .json), keeping the others'.

Allreduce, per recipe (``mnist_mlp``: 784-512-512-10 at batch 128; ``mnist_lenet``: LeNet-5 at
64; ``shakespeare_gpt``: the GPT at 32 x 64 tokens):

1. a calibration of the planner on these ranks (``meta.planner.calibrate.calibrate``):
   every rank times the recipe's step per node at the same time (so the cores are shared
   as in training; steps taken together give the wait on the slowest rank), and the link
   between two ranks is fitted from ping-pongs and allreduces;
2. the planner's prediction at P = the ranks for each allreduce option it ranks (MPI's
   allreduce with and without overlap; ZeRO-1 in shared memory);
3. the same steps measured: the recipe's network on its executor, wrapped in ``Allreduce``
   with those options, in blocks of ``--steps`` steps that alternate between the options
   (``--repeats`` blocks each, the median block kept);

``--trials`` (3) times, the rows holding the medians of the predictions and of the
measurements.

``--pipelines`` and ``--asynchronous`` (not under mpiexec) run the recipes themselves,
``--trials`` times (a calibration and a run each; a row holds the medians of both):
``mnist_pipeline`` at 2 and 4 stages, 4 and 8 micro-batches, GPipe and 1F1B, one epoch each;
``mnist_downpour`` and ``mnist_parameter_server`` at 2, 3 and 4 ranks on ``--async-samples``
samples; each a ``meta run`` under mpiexec against the planner's prediction from
``meta plan RECIPE --calibrate`` on the same ranks just before, the measured step being rank
0's timeline phases per step summed (for the asynchronous strategies, a worker's step).

``--two-nodes`` (not under mpiexec) runs the allreduce rows at P = 2 and 4 on two emulated
nodes: MPICH's ``MPIR_CVAR_NUM_CLIQUES=2`` splits the ranks into two groups (even and odd
ranks) with shared memory only within each, and ``UCX_TLS=tcp,self`` sends what crosses
between them through the TCP stack, as between two machines. The calibration then measures
both links and the planner costs the allreduce on the one between nodes.

A row whose error is beyond ``--bound`` (20 %, the issue's acceptance) is marked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from meta.bench.environment import cpu_model
from meta.common.files import write_text
from meta.lv3 import Allreduce, world
from meta.planner.calibrate import TWO_NODES_ENV, TrainingStep, calibrate
from meta.planner.machine import save_machine
from meta.planner.costs import allreduce_costs
from meta.planner.workload import make_workload
from meta.run.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
ALONE = "no exchange"
OPTIONS = {"allreduce": {"overlap": False, "shared_memory": False},
           "allreduce overlapped": {"overlap": True, "shared_memory": False},
           "allreduce ZeRO-1 (shared memory)": {"overlap": False, "shared_memory": True}}


def stepper(recipe, comm, options: dict | None):
    """One step of the recipe's network under ``Allreduce(**options)``; ``None``: the
    executor and optimizer alone, no exchange (the compute alongside)."""
    built = TrainingStep.build(recipe, profile=False)
    if options is None:
        return built.runner()
    strategy = Allreduce(built.optimizer, comm, **options)
    feeds = built.feeds(built.batch)
    return lambda: strategy.step_with(built.executor, feeds)


def timed_blocks(steps: dict, args, comm) -> dict[str, float]:
    """Each step's seconds: ``--repeats`` blocks of ``--steps`` steps, the options' blocks
    alternating, the median block; the slower rank's (a synchronous step ends when all
    have)."""
    times: dict[str, list[float]] = {label: [] for label in steps}
    for _ in range(args.repeats):
        for label, step in steps.items():
            comm.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[label].append((time.perf_counter() - start) / args.steps)
    return {label: comm.allreduce_obj(statistics.median(t), op="max")
            for label, t in times.items()}


def measure(name: str, args, comm) -> list[dict]:
    """The allreduce rows of one recipe: ``--trials`` times a calibration and its predictions,
    then the steps measured; each row the medians of both (one calibration at 3 ranks on 2
    cores had the MLP's compute 17 % low, and one measurement of the MLP on two emulated
    nodes at 4 ranks took 19.2 ms a step, another 22.8)."""
    recipe = load_recipe(REPO / "recipes" / f"{name}.py")
    predictions: dict[str, list[tuple[float, float]]] = {}  # (step, its exchange)
    measured: dict[str, list[float]] = {}
    steps: dict = {}
    for trial in range(args.trials):
        machine = calibrate(recipe, comm=comm, steps=args.steps)
        if args.keep_calibrations and comm.rank == 0:
            suffix = "_two_nodes" if args.two_nodes else ""
            save_machine(machine, Path(args.keep_calibrations)
                         / f"{name}_{comm.size}{suffix}_{trial}.toml")
        if args.two_nodes and machine.nodes != 2:
            raise SystemExit(f"planner_validation: --two-nodes: MPI placed the {comm.size} ranks"
                             f" on {machine.nodes} node(s), not 2 (the emulation needs MPICH: "
                             f"{' '.join(f'{k}={v}' for k, v in TWO_NODES_ENV.items())})")
        if machine.nodes == 1:  # all P ranks on this node (P may be more than its cores)
            machine = machine.oversubscribed(comm.size)
        where = f"{machine.nodes} nodes: " if machine.nodes > 1 else ""
        work = make_workload(recipe, machine)
        for pr in allreduce_costs(work, machine, comm.size):
            predictions.setdefault(where + pr.label, []).append(
                (pr.step_s, pr.step_s - work.compute_s - work.update_s))
        if not steps:
            steps = {where + label: stepper(recipe, comm, opts)
                     for label, opts in OPTIONS.items() if where + label in predictions}
            steps[ALONE] = stepper(recipe, comm, None)
            for step in steps.values():
                for _ in range(args.warmup):
                    step()
        for label, seconds in timed_blocks(steps, args, comm).items():
            measured.setdefault(label, []).append(seconds)
    rows = []
    alone = statistics.median(measured[ALONE])
    for label in steps:
        if label == ALONE:
            continue
        predicted = statistics.median(s for s, _ in predictions[label])
        step = statistics.median(measured[label])
        # the model's exchange on top of the compute measured in the same blocks: the
        # communication model's error, the load's drift since the calibration taken out
        beside = alone + statistics.median(e for _, e in predictions[label])
        error = predicted / step - 1
        rows.append({"recipe": name, "ranks": comm.size, "configuration": label,
                     "machine": here(),
                     "predicted_ms": predicted * 1e3, "measured_ms": step * 1e3,
                     "error": error, "beyond_bound": abs(error) > args.bound,
                     "alone_ms": alone * 1e3, "beside_ms": beside * 1e3,
                     "beside_error": beside / step - 1,
                     "link": str(machine.intra) if not where else
                     f"{where}within a node {machine.intra}, between nodes {machine.inter}",
                     "compute": work.source,
                     "trials": [{"predicted_ms": p * 1e3, "measured_ms": m * 1e3}
                                for (p, _), m in zip(predictions[label], measured[label])]})
    return rows


def table(rows: list[dict], bound: float) -> str:
    lines = ["| recipe | P | configuration | predicted ms | measured ms | error | "
             "no exchange, same blocks ms | + modelled exchange ms | its error | load |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        mark = f" **beyond ±{bound:.0%}**" if r["beyond_bound"] else ""
        lines.append(f"| {r['recipe']} | {r['ranks']} | {r['configuration']} | "
                     f"{r['predicted_ms']:.2f} | {r['measured_ms']:.2f} | "
                     f"{r['error']:+.0%}{mark} | " + (
                         f"{r['alone_ms']:.2f} | {r['beside_ms']:.2f} | "
                         f"{r['beside_error']:+.0%} |" if "alone_ms" in r else "- | - | - |")
                     + f" {r['load'].removeprefix('load average ')} |")
    return "\n".join(lines)


def _meta(ranks: int, *words: str) -> list[str]:
    import sys
    return ["mpiexec", "-n", str(ranks), sys.executable, "-m", "meta", *words]


def _calibrated(recipe_name: str, ranks: int, steps: int, tmp: Path):
    """``meta plan RECIPE --calibrate`` under ``mpiexec -n ranks`` (every rank stepping the
    recipe at once, as they will share the cores in the run), read back."""
    import subprocess

    from meta.planner.machine import load_machine

    toml = tmp / f"{recipe_name}_{ranks}.toml"
    subprocess.run(_meta(ranks, "plan", recipe_name, "--calibrate", str(toml), "--steps",
                         str(steps)), check=True, capture_output=True)
    machine = load_machine(toml).oversubscribed(ranks)
    recipe = load_recipe(REPO / "recipes" / f"{recipe_name}.py")
    return machine, make_workload(recipe, machine)


def _run_metrics(recipe_name: str, ranks: int, sets: dict[str, str], out: Path) -> dict:
    """One ``meta run`` of the recipe under ``mpiexec -n ranks``: its metrics.json's metrics."""
    import subprocess

    words = ["run", str(REPO / "recipes" / f"{recipe_name}.py"), "--output-dir", str(out),
             "--no-export", "--no-plots"]
    for key, value in sets.items():
        words += ["--set", f"{key}={value}"]
    done = subprocess.run(_meta(ranks, *words), capture_output=True, text=True)
    path = out / "metrics.json"
    if not path.exists():
        raise SystemExit(f"planner_validation: {recipe_name} at -n {ranks} wrote no metrics "
                         f"(exit {done.returncode}): {done.stderr.strip()[-400:]}")
    return json.loads(path.read_text())["metrics"]


def _phases_per_step(metrics: dict) -> float:
    """Rank 0's step: its timeline's phases per step (forward, backward, compute, pack,
    update, communicate) summed, in seconds."""
    return sum(metrics[f"{k}_ms_per_step"] / 1e3 for k in
               ("forward", "backward", "compute", "pack", "update", "communicate")
               if f"{k}_ms_per_step" in metrics)


def _row(recipe: str, ranks: int, label: str, trials: list[tuple[float, float]], machine,
         work, args) -> dict:
    """A configuration's row from its trials' (predicted, measured) seconds: the medians of
    each, so one calibration or run that a slow spell of the machine caught does not decide
    the row (this VM's step times of polling strategies moved by a third between runs)."""
    predicted = statistics.median(p for p, _ in trials)
    measured = statistics.median(m for _, m in trials)
    error = predicted / measured - 1
    row = {"recipe": recipe, "ranks": ranks, "configuration": label, "machine": here(),
           "predicted_ms": predicted * 1e3, "measured_ms": measured * 1e3, "error": error,
           "beyond_bound": abs(error) > args.bound, "link": str(machine.intra),
           "compute": work.source, "load": f"load average {os.getloadavg()[0]:.1f}",
           "trials": [{"predicted_ms": p * 1e3, "measured_ms": m * 1e3} for p, m in trials]}
    print(row, flush=True)
    return row


def pipelines(args) -> list[dict]:
    """Pipelines of 2 and 4 stages on as many ranks: each a ``meta run`` of
    ``mnist_pipeline`` for one epoch (the stages' executor, its messages, the recipe's own
    step), against the planner's prediction from a calibration of the same recipe on the
    same ranks just before. The measured step is rank 0's phases per step summed."""
    import tempfile

    from meta.planner.costs import pipeline_cost

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for stages in (2, 4):
            trials: dict[str, list[tuple[float, float]]] = {}
            for trial in range(args.trials):
                machine, work = _calibrated("mnist_pipeline", stages, args.steps, Path(tmp))
                for m, sched in ((4, "1f1b"), (8, "1f1b"), (4, "gpipe"), (8, "gpipe")):
                    metrics = _run_metrics(
                        "mnist_pipeline", stages,
                        {"epochs": "1", "distributed.micro_batches": str(m),
                         "distributed.schedule": sched},
                        Path(tmp) / f"run_{stages}_{m}_{sched}_{trial}")
                    pr = pipeline_cost(work, machine, stages, stages, m, sched, 1)
                    trials.setdefault(pr.label, []).append(
                        (pr.step_s, _phases_per_step(metrics)))
            rows += [_row("mnist_pipeline", stages, label, pairs, machine, work, args)
                     for label, pairs in trials.items()]
    return rows


def two_nodes(args) -> None:
    """The allreduce rows on two emulated nodes, at 2 and 4 ranks: this script under
    ``mpiexec`` with ``TWO_NODES_ENV``; its ranks write their rows into the report."""
    import subprocess
    import sys

    env = {**os.environ, **TWO_NODES_ENV}
    for ranks in map(int, args.two_node_ranks.split(",")):
        words = [sys.executable, __file__, "--two-nodes", "--recipes", args.recipes,
                 "--steps", str(args.steps), "--repeats", str(args.repeats), "--warmup",
                 str(args.warmup), "--bound", str(args.bound), "--out", args.out,
                 "--trials", str(args.trials)]
        if args.keep_calibrations:
            words += ["--keep-calibrations", args.keep_calibrations]
        subprocess.run(["mpiexec", "-n", str(ranks), *words], env=env, check=True)


ASYNCHRONOUS = {  # recipe -> the planner's label of its configuration, the run's settings
    # Downpour without its warm start: rank 0 (whose step is measured) would otherwise step
    # alone for its first 50 steps, over half of its 86 at 4 ranks, and its mean step would
    # mix those with the steady state the planner predicts (measured: 4.4 ms a step against
    # 6.0 for every worker, itself included, without the warm start)
    "mnist_downpour": ("Downpour, 1 server(s), push/1 fetch/1",
                       {"distributed.warm_start_steps": "0"}),
    "mnist_parameter_server": ("asynchronous parameter server (1)", {}),
}


def asynchronous(args) -> list[dict]:
    """Downpour (one server, push and fetch every step) and the asynchronous parameter server
    at 2, 3 and 4 ranks (a server and 1 to 3 workers): a ``meta run`` of a shortened epoch of
    each recipe against the planner's prediction of a worker's step, from a calibration of
    the recipe on the same ranks just before. The measured step is worker 0's (rank 0's)
    phases per step summed."""
    import tempfile

    from meta.planner.costs import parameter_server_costs

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (label, settings) in ASYNCHRONOUS.items():
            for ranks in (2, 3, 4):
                trials = []
                for trial in range(args.trials):
                    machine, work = _calibrated(name, ranks, args.steps, Path(tmp))
                    sets = {"epochs": "1", "train_samples": str(args.async_samples), **settings}
                    metrics = _run_metrics(name, ranks, sets,
                                           Path(tmp) / f"run_{name}_{ranks}_{trial}")
                    pr = next(x for x in parameter_server_costs(work, machine, ranks)
                              if x.label == label)
                    trials.append((pr.step_s, _phases_per_step(metrics)))
                rows.append(_row(name, ranks, label, trials, machine, work, args))
    return rows


def here() -> str:
    """This machine, as a row records it."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def _ranks_of(rows: list[dict], recipes: tuple[str, ...], two_nodes: bool = False) -> str:
    ranks = sorted({r["ranks"] for r in rows if r["recipe"] in recipes
                    and r["configuration"].startswith("2 nodes") == two_nodes})
    return ", ".join(map(str, ranks))


def commands(rows: list[dict], trials: int = 3) -> list[str]:
    """What produced the rows: one line per kind of row present (``trials``: the allreduce
    rows', named where it is not the default)."""
    allreduce = ("mnist_mlp", "mnist_lenet", "shakespeare_gpt")
    more = f" --trials {trials}" if trials != 3 else ""
    out = []
    if ranks := _ranks_of(rows, allreduce):
        out.append(f"`mpiexec -n P python benchmarks/planner_validation.py{more}` (allreduce, P = "
                   f"{ranks})")
    if ranks := _ranks_of(rows, allreduce, two_nodes=True):
        out.append("`python benchmarks/planner_validation.py --two-nodes --two-node-ranks "
                   f"{ranks.replace(' ', '')}{more}` (allreduce on two emulated nodes: rows "
                   "`2 nodes: ...`)")
    if ranks := _ranks_of(rows, ("mnist_pipeline",)):
        out.append("`python benchmarks/planner_validation.py --pipelines` (pipelines of "
                   f"{ranks} stages)")
    if ranks := _ranks_of(rows, ("mnist_downpour", "mnist_parameter_server")):
        out.append("`python benchmarks/planner_validation.py --asynchronous` (Downpour and "
                   f"the asynchronous parameter server at {ranks} ranks)")
    return out


def write_report(rows: list[dict], args) -> None:
    text = table(rows, args.bound)
    print(text)
    out = Path(args.out)
    notes = sorted({f"{r['recipe']} at P = {r['ranks']}: {r['link']}; compute {r['compute']}"
                    for r in rows})
    within = sum(not r["beyond_bound"] for r in rows)
    trials = sorted({len(r["trials"]) for r in rows if "trials" in r} | {args.trials})
    machines = sorted({r.get("machine", here()) for r in rows})
    write_text(out, "# `meta plan` against measured step times\n\n"
               f"Produced by `benchmarks/planner_validation.py` on {' and '.join(machines)}, "
               f"last run {time.strftime('%Y-%m-%d')}:\n\n"
               + "\n".join(f"- {c}" for c in commands(rows, args.trials)) + "\n\n"
               f"Rows whose model error is beyond ±{args.bound:.0%} are marked: {within} of "
               f"{len(rows)} within. The load column is the load average when the row was "
               "measured (the benchmark's own ranks count). Each row holds the medians of "
               f"`--trials` ({'/'.join(map(str, trials))}) trials, each a calibration of the "
               "planner on the same ranks and then the measurement (a `meta run` for the "
               "pipelines and the asynchronous strategies)" + (
                   "; rows without trials in the JSON were measured once, after their "
                   "calibrations" if any("trials" not in r for r in rows) else "")
               + "; the last calibration's figures:"
               "\n\n" + "\n".join(f"- {x}" for x in notes) + "\n\n" + text + "\n")
    write_text(out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipes", default="mnist_mlp,mnist_lenet,shakespeare_gpt")
    parser.add_argument("--pipelines", action="store_true", help="(without mpiexec) the "
                        "pipeline rows instead, each a meta run under mpiexec -n 2 or 4")
    parser.add_argument("--asynchronous", action="store_true", help="(without mpiexec) the "
                        "Downpour and asynchronous parameter server rows instead, each a "
                        "meta run under mpiexec -n 2, 3 or 4")
    parser.add_argument("--two-nodes", action="store_true", help="(without mpiexec) the "
                        "allreduce rows on two emulated nodes instead, at --two-node-ranks")
    parser.add_argument("--two-node-ranks", default="2,4", help="the ranks of --two-nodes "
                        "(comma-separated: each split evenly between the two nodes)")
    parser.add_argument("--trials", type=int, default=3, help="trials per row, each a "
                        "calibration and a measurement (for --pipelines and --asynchronous, "
                        "a meta run): the rows hold the medians")
    parser.add_argument("--async-samples", type=int, default=16384, help="training samples "
                        "of the asynchronous runs")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bound", type=float, default=0.20)
    parser.add_argument("--out", default=str(REPO / "docs" / "results" / "planner_validation.md"))
    parser.add_argument("--keep-calibrations", metavar="DIR", help="save each allreduce "
                        "calibration's machine there (TOML), to predict from again")
    args = parser.parse_args()
    old = Path(args.out).with_suffix(".json")
    kept = json.loads(old.read_text()) if old.exists() else []
    if args.pipelines or args.asynchronous:
        rows = pipelines(args) if args.pipelines else asynchronous(args)
        write_report(merged(kept, rows), args)
        return
    comm = world()
    if args.two_nodes and comm.size == 1:
        two_nodes(args)
        return
    load_before = os.getloadavg()[0]
    rows = [r for name in args.recipes.split(",") for r in measure(name, args, comm)]
    load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    if comm.rank:
        return
    for r in rows:
        r["load"] = load
    write_report(merged(kept, rows), args)


def merged(kept: list[dict], rows: list[dict]) -> list[dict]:
    """The report's rows: the new ones replace the kept ones of the same recipe, ranks and
    configuration; ordered by recipe, ranks and configuration."""
    new = {(r["recipe"], r["ranks"], r["configuration"]) for r in rows}
    out = [r for r in kept if (r["recipe"], r["ranks"], r["configuration"]) not in new] + rows
    order = {name: i for i, name in enumerate(
        ["mnist_mlp", "mnist_lenet", "shakespeare_gpt", "mnist_pipeline", "mnist_downpour",
         "mnist_parameter_server"])}
    return sorted(out, key=lambda r: (order.get(r["recipe"], 99), r["ranks"]))

if __name__ == "__main__":
    main()
