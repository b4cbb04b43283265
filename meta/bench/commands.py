"""The benchmark commands of the ``meta`` CLI: ``run --repeat``, ``compare`` and ``bench-op``.

Kept out of ``meta/cli.py`` so that the CLI only wires them in; heavy imports happen when a
command runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from meta.run.recipe import parse_sets  # noqa: F401 - the recipe's KEY=VALUE parser, used here

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
REPORT, STEP_PLOT, LOSS_PLOT, OP_PLOT, ACCURACY_PLOT = (
    "report.json", "step_times.png", "loss_curves.png", "op_times.png", "accuracy_vs_time.png")


def attr_value(text: str):
    """An --attr value: int, float, a comma list of them, or a string."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if "," in text:
        return [attr_value(t) for t in text.split(",")]
    return text


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.strip("()[] ").split(",") if v.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected sizes like 256,1024, got {text!r}") from err


def add_commands(sub: Any) -> None:
    """Add ``compare`` and ``bench-op`` to the ``meta`` subcommands."""
    cmp = sub.add_parser(
        "compare", help="run two recipes, or one recipe's --variant's (any number), taking "
                        "turns; report step times, throughput, time to each bound and final "
                        "metrics with confidence intervals, ratios and plots")
    cmp.add_argument("recipe_a", metavar="A", help="recipe file or shipped recipe name")
    cmp.add_argument("recipe_b", metavar="B", nargs="?",
                     help="second recipe file (default: A again, told apart by --a/--b)")
    cmp.add_argument("--a", action="append", default=[], metavar="KEY=VALUE",
                     help="MUTABLE override of variant A only (repeatable)")
    cmp.add_argument("--b", action="append", default=[], metavar="KEY=VALUE",
                     help="MUTABLE override of variant B only (repeatable)")
    cmp.add_argument("--variant", action="append", default=[], metavar="K=V[,K=V...]",
                     help="one variant of recipe A, its MUTABLE overrides comma-separated "
                          "(repeat for each variant: an N-way comparison)")
    cmp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="MUTABLE override of every variant (repeatable)")
    add_run_options(cmp, default_repeat=3)
    cmp.add_argument("--output-dir", metavar="DIR",
                     help="where report.json and the plots go (default: runs/compare/A-vs-B)")
    cmp.set_defaults(func=cmd_compare)

    from meta.bench.opbench import default_inputs_help

    op = sub.add_parser(
        "bench-op", help="time any of an operator's implementations against any other "
                         "(--backend: numpy, native, planned, a user's op against the built-in), "
                         "forward and backward, then its forward across meta's backends "
                         "(reference, native, planned) and the frameworks installed (PyTorch, "
                         "onnxruntime), with a check that they agree (a user's op: --module, "
                         "--domain)",
        description="Times the implementations --backend names (default: numpy and its C++ "
                    "twin, or numpy and the planned executor where there is no twin; a "
                    "user's op against the built-in of its type), forward and backward, then "
                    "the forward across meta's backends (reference, native, planned) and the "
                    "frameworks installed (PyTorch, onnxruntime; one line 'not installed' "
                    "otherwise), on the same inputs, with the largest difference from the "
                    "reference. Without --shape, these ops run on typical sizes (one shape "
                    "per input; attributes): " + default_inputs_help())
    op.add_argument("op", help="operator type, e.g. Relu (`meta ops` lists them)")
    op.add_argument("--shape", type=_shape, action="append", default=[], metavar="N,M,...",
                    help="shape of an input, repeated once per input (e.g. --shape 8,3,32,32 "
                         "--shape 16,3,3,3 for Conv's X and W), or given once for every "
                         "input; default: the table above")
    op.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                    help="a node attribute (repeatable; ints, floats, comma lists, strings)")
    op.add_argument("--no-frameworks", action="store_true",
                    help="skip the forward comparison across backends and frameworks")
    op.add_argument("--dtype", default="float32", help="input dtype (default float32)")
    op.add_argument("--repeat", type=int, default=30, metavar="N",
                    help="timed calls per backend and pass (default 30)")
    op.add_argument("--warmup", type=int, default=3, metavar="W",
                    help="untimed calls first (default 3)")
    op.add_argument("--seed", type=int, default=0, help="inputs and bootstrap seed")
    op.add_argument("--precision", default="f32", metavar="P[,P]",
                    help="the planned executor's precision, comma-separated: f32 (default), "
                         "bf16 (matrix products and convolutions read bf16, accumulate "
                         "float32): each planned implementation runs at each (planned, planned "
                         "bf16), and the planned executor is added where --backend names none "
                         "(numpy and native compute float32)")
    op.add_argument("--threads", type=int, metavar="T",
                    help="BLAS and OpenMP threads (default: as set; on a busy machine, 1 "
                         "gives stabler figures)")
    op.add_argument("--output-dir", metavar="DIR",
                    help="where report.json and op_times.png go (default: runs/bench-op/OP)")
    op.add_argument("--domain", default="", help="operator domain (custom ops)")
    op.add_argument("--module", metavar="FILE.py", help="import this file first (it "
                    "registers custom ops)")
    op.add_argument("--backend", action="append", default=[], metavar="NAME[,NAME...]",
                    help="the implementations to compare, the first the baseline (repeatable "
                         "or comma-separated): a registered backend (numpy, native), planned "
                         "(a one-node graph on the planned executor), and for a --domain op "
                         "the built-in of its type (builtin numpy, builtin native, builtin "
                         "planned). Default: numpy and native, or numpy and planned where "
                         "there is no C++ twin; a user's op against builtin numpy")
    op.set_defaults(func=cmd_bench_op)


def add_run_options(parser: argparse.ArgumentParser, default_repeat: int = 0) -> None:
    """Options shared by ``run --repeat`` and ``compare``."""
    if default_repeat:
        parser.add_argument("--repeat", type=int, default=default_repeat, metavar="N",
                            help=f"timed runs per variant (default {default_repeat})")
    parser.add_argument("--warmup", type=int, default=0, metavar="W",
                        help="discarded runs per variant first (default 0)")
    parser.add_argument("--skip-steps", type=int, default=3, metavar="K",
                        help="leave each run's first K steps out of the step times (default 3)")
    parser.add_argument("--bootstrap-seed", type=int, default=0, metavar="S",
                        help="seed of the bootstrap resampling (default 0)")
    parser.add_argument("--no-plots", action="store_true", help="write the JSON report only")


def _say(comm: Any) -> Any:
    def say(line: str) -> None:
        if comm.is_root:
            print(line, flush=True)
    return say


def _finish(report: dict, results: list, out: Path, args: argparse.Namespace, title: str,
            say: Any) -> None:
    """Write the report and plots of a recipe benchmark, print its table."""
    from meta.bench import plots
    from meta.bench import report as reports

    written = [reports.write_json(report, out / REPORT)]
    if not args.no_plots:
        skip = args.skip_steps
        written.append(plots.box_plot(
            {r.variant.name: r.step_seconds(skip) * 1e3 for r in results}, out / STEP_PLOT,
            f"{title}: step times, {report['settings']['repeat']} run(s) each"))
        written.append(plots.loss_curves(
            {v["name"]: v["runs"] for v in report["variants"]}, out / LOSS_PLOT,
            f"{title}: loss"))
        bound = results[0].variant.recipe.metrics.get("test_accuracy")
        written.append(plots.accuracy_vs_time(
            {v["name"]: v["runs"] for v in report["variants"]}, out / ACCURACY_PLOT,
            f"{title}: test accuracy against time",
            bound=bound.bound if bound is not None else None))
    say(reports.recipe_table(report))
    say(f"meta: wrote {', '.join(str(p) for p in written)}")


def run_repeated(first_run: Any, args: argparse.Namespace, comm: Any) -> int:
    """``meta run RECIPE --repeat N``: N fresh runs, printed as ``meta run`` prints them, then
    the benchmark report. Exit 1 if any run missed a metric."""
    from meta.bench import report as reports
    from meta.bench.environment import environment, recipe_record
    from meta.bench.recipes import RecipeBench, RecipeVariant, default_factory

    overrides = parse_sets(args.set, "--set")
    recipe = first_run.recipe
    variant = RecipeVariant(recipe.name, recipe, recipe.path or Path(args.recipe), overrides)
    out = Path(args.output_dir) if args.output_dir else Path("runs") / recipe.name
    say = _say(comm)
    try:
        bench = RecipeBench([variant], default_factory(comm, sys.stdout), out, args.repeat,
                            args.warmup, say)
    except ValueError as err:  # every rank finds the same: all stop here, none in a collective
        if comm.is_root:
            print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    env = environment({recipe.name: recipe_record(variant.path, overrides)}, comm.size,
                      {"recipe": recipe.definitions.seed, "bootstrap": args.bootstrap_seed}) \
        if comm.is_root else {}  # before the runs: the load average then is not ours
    results = bench.run(first=first_run)
    if comm.is_root:
        report = reports.recipe_report("repeat", results, env, reports.settings(
            args.repeat, args.warmup, args.bootstrap_seed, skip_steps=args.skip_steps))
        _finish(report, results, out, args, recipe.name, say)
    return EXIT_OK if all(r.passed for r in results[0].runs) else EXIT_FAIL


def _variants(args: argparse.Namespace) -> list[Any]:
    from meta.bench.recipes import RecipeVariant
    from meta.run.recipe import load_recipe

    common = parse_sets(args.set, "--set")
    if args.variant:
        if args.recipe_b is not None or args.a or args.b:
            raise ValueError("compare: give --variant's of one recipe, or two recipes / --a and "
                             "--b, not both")
        if len(args.variant) < 2:
            raise ValueError("compare needs at least two --variant's")
        variants = []
        for text in args.variant:
            overrides = parse_sets([p for p in text.split(",") if p.strip()], "--variant")
            recipe = load_recipe(args.recipe_a).with_overrides({**common, **overrides})
            variants.append(RecipeVariant(text, recipe, recipe.path or Path(args.recipe_a),
                                          {**common, **overrides}))
        return variants
    sides = {"a": parse_sets(args.a, "--a"), "b": parse_sets(args.b, "--b")}
    paths = {"a": Path(args.recipe_a), "b": Path(args.recipe_b or args.recipe_a)}
    if args.recipe_b is None and sides["a"] == sides["b"]:
        raise ValueError("compare needs two variants: give a second recipe file, or --a and "
                         "--b overrides that differ (e.g. --a executor=reference "
                         "--b executor=native)")
    variants = []
    for side in ("a", "b"):
        overrides = {**common, **sides[side]}
        recipe = load_recipe(paths[side]).with_overrides(overrides)
        if args.recipe_b is None:
            name = ",".join(f"{k}={v}" for k, v in sides[side].items()) or "defaults"
        else:
            name = recipe.name
        variants.append(RecipeVariant(name, recipe, recipe.path or paths[side], overrides))
    if variants[0].name == variants[1].name:  # the same file twice, or two of one stem
        variants = [RecipeVariant(f"{v.name}-{s}", v.recipe, v.path, v.overrides)
                    for v, s in zip(variants, "ab")]
    return variants


def cmd_compare(args: argparse.Namespace) -> int:
    """``meta compare``: run two recipes (or one recipe's ``--variant``'s) taking turns and report
    step times, throughput, time to each bound and final metrics with intervals and ratios; exit 2
    on a bad recipe or option."""
    from meta.bench import report as reports
    from meta.bench.environment import environment, recipe_record
    from meta.bench.recipes import RecipeBench, default_factory, dir_name
    from meta.lv1 import GraphError
    from meta.lv2 import DatasetError
    from meta.lv3 import world
    from meta.run.recipe import RecipeError

    comm = world()
    say = _say(comm)
    try:
        variants = _variants(args)
        out = Path(args.output_dir) if args.output_dir else Path("runs") / "compare" / \
            dir_name("-vs-".join(v.name for v in variants))
        bench = RecipeBench(variants, default_factory(comm, None), out, args.repeat,
                            args.warmup, say)
    except (ValueError, RecipeError) as err:
        if comm.is_root:
            print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    # Recorded before the runs: the load average then is other processes', not ours.
    env = environment({v.name: recipe_record(v.path, v.overrides) for v in variants},
                      comm.size, {"bootstrap": args.bootstrap_seed,
                                  **{f"recipe {v.name}": v.recipe.definitions.seed
                                     for v in variants}}) if comm.is_root else {}
    say(f"meta: comparing {', '.join(v.name for v in variants)}: {args.repeat} run(s) each "
        f"after {args.warmup} warm-up run(s), taking turns")
    try:
        results = bench.run()
    except (RecipeError, DatasetError, GraphError) as err:
        if comm.is_root:
            print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if comm.is_root:
        report = reports.recipe_report("compare", results, env, reports.settings(
            args.repeat, args.warmup, args.bootstrap_seed, skip_steps=args.skip_steps))
        title = " vs ".join(v.name for v in variants) if len(variants) == 2 else \
            f"{variants[0].recipe.name}: {len(variants)} variants"
        _finish(report, results, out, args, title, say)
    return EXIT_OK


ONE_INPUT_SHAPE = (64, 4096)  # bench-op's input for an op of one input without --shape


def _one_input(op: str, domain: str) -> bool:
    """Whether ``op`` (of ``domain``) is registered and its forward takes one input (an
    activation, say): bench-op then needs no --shape."""
    from meta.bench.opbench import OpBenchError, implementations, input_count

    try:
        first = next(iter(implementations(op, domain).values()))
        return input_count(first.cls) == 1
    except (OpBenchError, StopIteration):
        return False


def cmd_bench_op(args: argparse.Namespace) -> int:
    """``meta bench-op``: the numpy/C++ table of ``meta.bench.opbench`` and then the forward across
    backends and frameworks of ``meta.bench.crossbench``; writes report.json and op_times.png. Exit
    2 on a bad operator, shape or attribute."""
    from meta.bench import plots
    from meta.bench import report as reports
    from meta.bench.environment import environment
    from meta.bench.opbench import OpBenchError, bench_op, op_table
    from meta.bench.recipes import dir_name
    from meta.common.threads import set_threads
    from meta.lv0.native import NativeUnavailableError

    if args.threads is not None:
        if args.threads < 1:
            print(f"meta: error: --threads must be at least 1, got {args.threads}",
                  file=sys.stderr)
            return EXIT_ERROR
        set_threads(args.threads)
    if args.module:
        from meta.lv0.registry import load_operator_file

        module, problem = load_operator_file(args.module)
        if module is None:
            print(f"meta: error: {problem}", file=sys.stderr)
            return EXIT_ERROR
    from meta.bench import crossbench
    from meta.bench.opbench import DEFAULT_INPUTS, twins

    shapes, attrs = args.shape, {}
    if not shapes:
        if args.op in DEFAULT_INPUTS and not args.domain:
            shapes, attrs = DEFAULT_INPUTS[args.op]
        elif _one_input(args.op, args.domain):
            shapes = [ONE_INPUT_SHAPE]
        else:
            print(f"meta: error: bench-op {args.op} needs --shape (one per input, or one for "
                  f"all); ops with default shapes: {', '.join(DEFAULT_INPUTS)} and any op of "
                  f"one input ({'x'.join(map(str, ONE_INPUT_SHAPE))})", file=sys.stderr)
            return EXIT_ERROR
    try:
        given = parse_sets(args.attr, "--attr")
        attrs = {**attrs, **{k: attr_value(v) for k, v in given.items()}}
    except ValueError as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    env = environment(seeds={"inputs": args.seed, "bootstrap": args.seed})  # load: not ours yet
    try:
        backends = [b.strip() for given in args.backend for b in given.split(",")
                    if b.strip()] or None
        precisions = tuple(p.strip() for p in args.precision.split(",") if p.strip())
        result = bench_op(args.op, shapes, args.dtype, args.repeat, args.warmup, args.seed,
                          domain=args.domain, attrs=attrs, backends=backends,
                          precisions=precisions)
    except (OpBenchError, NativeUnavailableError, ValueError) as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    cross = None
    if not args.no_frameworks:
        cross = crossbench.compare(result.op_type, twins(args.op, args.domain), result.inputs,
                                   attrs, args.domain, args.repeat, args.warmup, args.threads)
    shape = "x".join(map(str, result.shape))
    out = Path(args.output_dir) if args.output_dir else \
        Path("runs") / "bench-op" / dir_name(f"{result.op_type}-{shape}-{result.dtype}"
                                             + ("-" + "-".join(precisions)
                                                if precisions != ("f32",) else ""))
    report = {
        "schema": reports.SCHEMA, "kind": "op",
        "environment": env,
        "settings": {**reports.settings(args.repeat, args.warmup, args.seed),
                     "op": result.op_type, "shape": list(result.shape), "dtype": result.dtype,
                     "precision": list(precisions),
                     "shapes": [list(s) for s in result.shapes], "attrs": attrs},
        "variants": result.to_variants(),
        "implementations": result.implementations,
        "comparisons": [reports.comparison(f"{result.baseline} {p}", f"{c} {p}", "time_s", r)
                        for p, by in result.ratios.items() for c, r in by.items()],
        "max_abs_diff": result.max_abs_diff,
        **({"across": cross.to_dict()} if cross is not None else {})}
    written = [reports.write_json(report, out / REPORT)]
    title = f"{result.op_type} {result.dtype} {shape}"
    written.append(plots.box_plot(
        {v["name"]: [t * 1e6 for t in v["times_s"]] for v in report["variants"]},
        out / OP_PLOT, f"{title}: {args.repeat} calls each", "time per call (µs)"))
    print("\n".join([op_table(result, args.repeat, args.warmup),
                     *([crossbench.table(cross)] if cross is not None else []),
                     *([f"--precision {args.precision} applies to the first table; the "
                        f"planned row across backends is the float32 plan"]
                       if cross is not None and precisions != ("f32",) else []),
                     *reports.load_note(report["environment"])]))
    print(f"meta: wrote {', '.join(str(p) for p in written)}")
    return EXIT_OK
