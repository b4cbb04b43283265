"""The ``meta plan`` subcommand: its arguments and what it does (``meta/cli.py`` only hooks it
in). Heavy imports wait inside ``cmd_plan`` so ``meta --help`` stays fast."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any


def add_plan_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    plan = sub.add_parser("plan", help="predict and rank parallel strategies for a recipe at P "
                          "ranks (--calibrate: measure this machine first)")
    plan.add_argument("recipe", nargs="?", help="recipe file or shipped recipe name")
    plan.add_argument("--ranks", type=int, default=0, help="P, the ranks to plan for")
    plan.add_argument("--machine", metavar="FILE", help="machine TOML (default: the cost "
                      "model's defaults, or what --calibrate writes)")
    plan.add_argument("--calibrate", metavar="OUT", nargs="?", const="machine.toml",
                      help="measure this machine (and RECIPE's step) into OUT "
                      "(default machine.toml); under mpiexec -n 2 the links too")
    plan.add_argument("--steps", type=int, default=5, help="steps timed by --calibrate in "
                      "each round")
    plan.add_argument("--repeats", type=int, default=3, help="--calibrate's rounds of "
                      "--steps steps: their spread says how far to trust the step (default 3)")
    plan.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override the recipe's MUTABLE values (as meta run)")
    plan.add_argument("--top", type=int, default=15, help="rows of the ranking shown")
    plan.add_argument("--memory", type=float, metavar="GB", help="memory per rank in GB "
                      "(2^30 bytes): configurations predicted to need more (parameters, "
                      "gradients, optimizer state, activations, buffers) are dropped")
    plan.add_argument("--validated", metavar="JSON", action="append", help="measured "
                      "model errors (benchmarks/planner_validation.py's JSON; again for more "
                      "files: the worst row counts): shown per configuration, marked beyond "
                      "--bound")
    plan.add_argument("--bound", type=float, default=0.20, help="the model error bound "
                      "(default 0.20)")
    plan.add_argument("--plot", metavar="PNG", help="plot predicted throughput against P "
                      "(1 to 4,096) for each strategy (with --simulate: test accuracy "
                      "against simulated time, per N)")
    plan.add_argument("--simulate", metavar="N[,N...]", help="run the recipe's Downpour or "
                      "asynchronous parameter server with N virtual workers in virtual time "
                      "(real gradients, simulated clocks) and print test accuracy against "
                      "simulated time")
    plan.add_argument("--sigma", type=float, default=0.2, help="--simulate's stragglers: each "
                      "step's compute time times a lognormal factor of median 1 and this "
                      "sigma (default 0.2; 0: none)")
    plan.add_argument("--seed", type=int, default=0, help="--simulate's straggler seed")
    plan.add_argument("--points", type=int, default=20, help="--simulate's evaluations of "
                      "the test set (evenly spaced in simulated time)")
    plan.add_argument("--compute-ms", type=float, metavar="MS", help="--simulate's compute "
                      "time per step (e.g. a measured one) instead of the planner's")
    plan.set_defaults(func=cmd_plan)
    return plan


def cmd_plan(args: argparse.Namespace) -> int:
    """``meta plan``; a bad recipe, machine file or option is one line and exit status 2."""
    from meta.common.component import ComponentError
    from meta.lv2.datasets import DatasetError
    from meta.planner.machine import MachineError
    from meta.planner.virtual_time import SimulationError
    from meta.run.recipe import RecipeError

    try:
        return _simulate(args) if args.simulate is not None else _plan(args)
    except (RecipeError, MachineError, ComponentError, SimulationError) as err:
        print(f"meta plan: {err}", file=sys.stderr)
        return 2
    except DatasetError as err:  # the recipe's data, read to size its network
        print(f"meta plan: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2


def _plan(args: argparse.Namespace) -> int:
    from meta.lv3 import world
    from meta.planner.calibrate import UNRELIABLE_NOTE, calibrate
    from meta.planner.machine import Machine, MachineError, load_machine, save_machine
    from meta.run.recipe import RecipeError, load_recipe, parse_sets

    start = time.perf_counter()
    try:
        overrides = parse_sets(args.set, "--set")
    except ValueError as err:  # said in one line, exit 2, as a recipe error is
        raise RecipeError(str(err)) from None
    recipe = load_recipe(args.recipe).with_overrides(overrides) if args.recipe else None
    machine = load_machine(args.machine) if args.machine else Machine()
    if args.calibrate:
        comm = world()
        if args.steps < 1 or args.repeats < 1:
            raise MachineError(f"--steps {args.steps} --repeats {args.repeats}: both must "
                               f"be >= 1")
        machine = calibrate(recipe, machine if args.machine else None, comm, args.steps,
                            sys.stdout, args.repeats)
        if comm.rank == 0:
            save_machine(machine, args.calibrate)
            print(f"meta plan: wrote {args.calibrate} ({machine.source})")
        if not args.ranks:
            return 0
    if not 0 <= args.bound < math.inf:
        raise MachineError(f"--bound {args.bound}: must be a finite number >= 0")
    if args.memory is not None and not 0 < args.memory < math.inf:
        raise MachineError(f"--memory {args.memory}: must be a finite number of GB > 0")
    if recipe is None or args.ranks < 1:
        print("meta plan: give a RECIPE and --ranks P (or --calibrate [OUT])", file=sys.stderr)
        return 2
    from meta.planner.costs import grad_dtype_of, rank_configurations
    from meta.planner.report import best_sets, load_validation, plot_scaling, table
    from meta.planner.workload import make_workload

    work = make_workload(recipe, machine)
    predictions = rank_configurations(work, machine, args.ranks, grad_dtype_of(recipe))
    print(f"meta plan: {recipe.name} at P = {args.ranks} on {machine.name} "
          f"({machine.ranks_per_node} ranks per node; {machine.source})")
    print(f"meta plan: compute {work.source}; one rank's step "
          f"{(work.compute_s + work.update_s) * 1e3:.3f} ms at batch {work.batch}"
          f"{_as_calibrated(machine, recipe.name, work)}")
    if UNRELIABLE_NOTE + " [" in machine.source:
        reasons = machine.source.split(UNRELIABLE_NOTE + " [", 1)[1].split("]", 1)[0]
        print(f"meta plan: warning: {UNRELIABLE_NOTE}: {reasons} (this plan uses it)",
              file=sys.stderr)
    if args.memory is not None:
        predictions = _within_memory(predictions, args.memory)
        if not predictions:
            return 2
    validation = load_validation(args.validated, recipe.name) if args.validated else None
    print(table(predictions, args.top, validation, args.bound))
    print(best_sets(predictions, recipe))
    if args.plot:
        plot_scaling(work, machine, args.plot, recipe.name)
        print(f"meta plan: wrote {args.plot}")
    print(f"meta plan: planned in {time.perf_counter() - start:.2f} s")
    return 0


def _within_memory(predictions: list[Any], gb: float) -> list[Any]:
    """``--memory GB``: the configurations that fit, and one line saying how many were dropped
    and why (on stderr, with exit status 2, when none fits)."""
    from meta.planner.costs import within_memory
    from meta.planner.memory import MB

    kept, dropped = within_memory(predictions, gb * (1 << 30))
    if not kept:
        least = min(dropped, key=lambda x: x.memory_bytes)
        print(f"meta plan: --memory {gb:g} GB: none of the {len(dropped)} configurations fits "
              f"in {gb * 1024:,.0f} MB per rank (the smallest, {least.label}, needs "
              f"{least.memory_bytes / MB:,.0f} MB: more ranks, or a smaller model or batch)",
              file=sys.stderr)
    elif dropped:
        most = max(dropped, key=lambda x: x.memory_bytes)
        print(f"meta plan: --memory {gb:g} GB: dropped {len(dropped)} of {len(predictions)} "
              f"configurations that need more than {gb * 1024:,.0f} MB per rank (up to "
              f"{most.memory_bytes / MB:,.0f} MB: {most.label})")
    return kept


def _as_calibrated(machine: Any, name: str, work: Any) -> str:
    """Where the plan's step is the calibration's, the calibration's own figure beside it:
    the same number at the calibrated batch; at another batch, the calibrated one it was
    scaled from (a calibration at ``--set batch_size=8`` planned at the recipe's 64 quotes a
    step three times as long, which read as a contradiction: issue 45)."""
    costs = machine.costs.get(name)
    if costs is None or not work.source.startswith("measured"):
        return ""
    step = costs.step_s * 1e3
    if costs.batch == work.batch:
        return " (the calibration's step)"
    return (f" (scaled from the calibration's {step:.3f} ms at batch {costs.batch}: a fixed "
            f"part per call, the rest linear in the batch)")


def _simulate(args: argparse.Namespace) -> int:
    """``meta plan RECIPE --simulate N[,N...]``: accuracy against simulated time per N."""
    from meta.planner.machine import Machine, load_machine
    from meta.planner.virtual_time import (
        SimulationError,
        curve_table,
        plot_curves,
        simulate,
        timing_for,
    )
    from meta.run.recipe import RecipeError, load_recipe, parse_sets

    try:
        counts = [int(n) for n in args.simulate.split(",")]
    except ValueError:
        raise SimulationError(f"--simulate {args.simulate!r}: expected worker counts such as "
                              f"8,64,512") from None
    if not counts or min(counts) < 1:
        raise SimulationError(f"--simulate {args.simulate!r}: worker counts must be >= 1")
    for key, value, bad, bound in (  # "not >=": nan is bad too
            ("--sigma", args.sigma, not (0 <= args.sigma < math.inf), "a finite number >= 0"),
            ("--points", args.points, args.points < 1, ">= 1"),
            ("--compute-ms", args.compute_ms, args.compute_ms is not None
             and not 0 < args.compute_ms < math.inf, "a finite number > 0")):
        if bad:
            raise SimulationError(f"{key} {value}: must be {bound}")
    if not args.recipe:
        raise SimulationError("--simulate needs a RECIPE (distributed downpour or "
                              "async_parameter_server)")
    try:
        overrides = parse_sets(args.set, "--set")
    except ValueError as err:
        raise RecipeError(str(err)) from None
    recipe = load_recipe(args.recipe).with_overrides(overrides)
    machine = load_machine(args.machine) if args.machine else Machine()
    compute = None if args.compute_ms is None else args.compute_ms / 1e3
    curves = []
    for n in counts:
        timing = timing_for(recipe, machine, n, args.sigma, args.seed, compute)
        curves.append(simulate(recipe, n, timing, args.points))
        print(curve_table(curves[-1]), flush=True)
    if args.plot:
        plot_curves(curves, args.plot, f"{recipe.name}: virtual time on {machine.name} "
                    f"(lognormal stragglers, sigma {args.sigma:g})")
        print(f"meta plan: wrote {args.plot}")
    return 0
