"""The ``meta`` command line: ``meta run RECIPE``, ``meta recipes``, ``meta inspect MODEL.onnx``,
``meta ops``, ``meta check-op OP``."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from typing import Sequence

from meta.bench.commands import add_commands as add_bench_commands
from meta.bench.commands import add_run_options, attr_value
from meta.lv1.plan.precision import PRECISIONS
from meta.run.recipe import parse_sets

# What an exit status means (README, "Runs that survive"): one thing each.
EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2  # PASS; a metric missed its bound; a user error
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # interrupted (128 + the signal), as shells report it
INTERRUPT_GRACE_S = 5.0  # under mpiexec, how long other ranks leave rank 0 to checkpoint


class UsageError(SystemExit):
    """A command line meta cannot read: its one line is printed on stderr, then the command
    exits 2 (argparse's status for usage errors). ``str()`` is the message."""

    def __init__(self, message: str) -> None:
        # an argument holding a newline or another control character stays on the one line
        message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
        print(f"meta: error: {message}", file=sys.stderr, flush=True)
        super().__init__(EXIT_ERROR)
        self.message = message

    def __str__(self) -> str:
        return self.message


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (``meta: error: ...``, exit 2), not the usage
    block: a wrong option reads like every other mistake."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _count(text: str) -> int:
    """A count option (``--checkpoint-every``, ``--repeat``): an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


DISTRIBUTION = "meta-dnn"  # what pip installs (pyproject.toml); the import name is meta


def version_line() -> str:
    """``meta --version``: the installed distribution's version (pip's record of what is
    installed) or, run from a source tree that pip did not install, ``meta.__version__``; and
    where the imported package lives, as ``pip --version`` says, so a shadowing copy shows."""
    from importlib import metadata
    from pathlib import Path

    import meta

    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = meta.__version__
    return f"meta {version} from {Path(meta.__file__).parent} (Python {sys.version.split()[0]})"


def version_text() -> str:
    """``meta --version``'s lines: ``version_line()``, then whether bf16 is native on this CPU
    and what ``precision=bf16`` runs as here (``meta.lv1.plan.precision`` decides both)."""
    from meta.lv1.plan.precision import native_line

    return f"{version_line()}\n{native_line()}"


class _Version(argparse.Action):
    """``--version``, its text made when asked for (not each time the parser is built: it
    reads /proc/cpuinfo)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print meta's version, where it is installed, and whether bf16 is "
                 "native on this CPU; then exit"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(), flush=True)
        parser.exit()


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    try:
        return parse_sets(pairs, "--set")
    except ValueError as err:
        raise UsageError(str(err)) from None


def _user_message(args: argparse.Namespace, comm, err: BaseException, folder) -> str | None:
    """The one line for an exception raised in code the user brought (``meta.run.errors``), its
    traceback kept in ``folder/error.log`` (by rank 0) and printed with ``--debug``; None when
    meta's own code raised."""
    from pathlib import Path

    from meta.run.errors import keep_traceback, raised_in_user_file, user_error

    user = user_error(err) or raised_in_user_file(err, [Path(args.recipe).resolve().parent])
    if user is None:
        return None
    if getattr(args, "debug", False):
        print(user.details, file=sys.stderr, end="", flush=True)
    log = keep_traceback(folder, user) if comm.is_root else None
    return f"{user}; traceback in {log}" if log else f"{user} (--debug shows the traceback)"


def _prepare(args: argparse.Namespace, comm, locks: list):
    """(RecipeRun, None) or (None, the input error's message) on this rank. Rank 0 first
    takes the output folder's lock (appended to ``locks``): one run per folder."""
    from meta.common.component import ComponentError
    from meta.lv1 import GraphError
    from meta.lv2 import CheckpointError, DatasetError
    from meta.run.recipe import RecipeError, load_recipe
    from meta.run.run_dir import RunDirError, RunLock, output_folder
    from meta.run.runner import RecipeRun

    try:
        recipe = load_recipe(args.recipe).with_overrides(_parse_sets(args.set))
        if comm.is_root:
            locks.append(RunLock(output_folder(recipe.name, args.output_dir)))
        return RecipeRun(recipe, comm, output_dir=args.output_dir, progress=not args.quiet,
                         export_onnx=not args.no_export,
                         checkpoint_every=args.checkpoint_every, resume=args.resume,
                         locks=locks), None
    except (RecipeError, ComponentError, DatasetError, GraphError, CheckpointError,
            RunDirError) as err:
        if getattr(args, "debug", False):
            traceback.print_exc()
        return None, str(err)
    except Exception as err:
        message = _user_message(args, comm, err, locks[0].folder if locks else None)
        if message is None:
            raise
        return None, message


def cmd_run(args: argparse.Namespace) -> int:
    """``meta run``: train a recipe and judge its metrics; exit 0 PASS, 1 FAIL, 2 bad usage, 130/143
    after SIGINT/SIGTERM (checkpointed at a step boundary)."""
    from meta.lv3 import world
    from meta.run.errors import SIGNALS, Interrupted

    comm, locks = world(), []
    try:
        with SIGNALS:  # SIGINT/SIGTERM: stop at a step boundary, checkpoint, exit 130/143
            code = _run(args, comm, locks)
    except KeyboardInterrupt as err:
        code = err.exit_code if isinstance(err, Interrupted) else EXIT_SIGINT
        if comm.is_root:
            name = err.name if isinstance(err, Interrupted) else "SIGINT"
            where = getattr(err, "where", "") or "before training"
            print(f"meta: interrupted by {name} {where}", file=sys.stderr, flush=True)
        if comm.size > 1:  # the other ranks may be waiting in a collective: end them all
            for lock in locks:
                lock.release()
            if not comm.is_root:  # rank 0 checkpoints, says so and ends the job; if it cannot
                time.sleep(INTERRUPT_GRACE_S)  # (waiting in a collective), this rank does
            comm.abort(code)
    finally:  # also on exit 2 and Ctrl-C; a killed run leaves a lock the next run takes over
        for lock in locks:
            lock.release()
    from meta.lv3.comm.survival import end_without_finalize_after_a_death

    end_without_finalize_after_a_death(code)
    return code


def _run(args: argparse.Namespace, comm, locks: list) -> int:
    from meta.run.run_dir import training_error

    run, error = _prepare(args, comm, locks)
    # Ranks agree on whether any failed before anyone enters a collective; rank 0 reports.
    errors = comm.gather_obj(error)
    if comm.is_root:
        for message in dict.fromkeys(e for e in errors if e):
            failed_on = [r for r, e in enumerate(errors) if e == message]
            where = "" if comm.size == 1 or len(failed_on) == comm.size else \
                f" (on rank {', '.join(map(str, failed_on))})"
            print(f"meta: error{where}: {message}", file=sys.stderr)
    if comm.bcast_obj(any(errors) if comm.is_root else None):
        return EXIT_ERROR
    from meta.lv3.comm.agreement import AgreementError, agree_on, run_payload

    try:  # the ranks run one recipe, with the same definitions and data, or none starts
        trainer = run.trainer
        agree_on(comm, run_payload(run.recipe.name, run.recipe.definitions.as_dict(),
                                   trainer.executor.graph.parameters,
                                   {"train": trainer.train_data, "test": trainer.test_data},
                                   trainer.position() if run.resumed else None))
    except AgreementError as err:
        if comm.is_root:
            print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.repeat:  # a benchmark: N fresh runs, a report with statistics and plots
            from meta.bench.commands import run_repeated

            return run_repeated(run, args, comm)
        outcome = run.execute()
    except Exception as err:
        from meta.lv3.comm.liveness import end_if_a_peer_died

        end_if_a_peer_died()  # MPICH reported a dead rank as an error: one line, exit 3
        # user code that raised (an event, a metric, an operator): one line, exit 2
        message = _user_message(args, comm, err, run.output_dir)
        if message is None:  # a NaN loss, a bad backward, a full disk: one line
            message = training_error(run, err)
            if message is not None and getattr(args, "debug", False):
                traceback.print_exc()
        if message is None:  # a rank died (MPI with ULFM) where the run cannot survive it
            from meta.lv3.comm.survival import failure_message

            message = failure_message(comm, err)
        if message is not None:
            where = f" (on rank {comm.rank})" if comm.size > 1 else ""
            print(f"meta: error{where}: {message}", file=sys.stderr, flush=True)
        if comm.size > 1:  # the other ranks may be waiting in a collective: end them all
            if message is None:
                traceback.print_exc()
                print(f"meta: rank {comm.rank} failed; aborting all {comm.size} ranks",
                      file=sys.stderr, flush=True)
            for lock in locks:
                lock.release()
            # Under ULFM, after a death: exit 2 without MPI_Abort, which mpiexec --with-ft
            # ulfm reported now and then as exit 0 (a pipeline that lost a stage, issue 44);
            # it exits with the survivors' status, and each survivor gets here
            from meta.lv3.comm.survival import end_without_finalize_after_a_death

            end_without_finalize_after_a_death(EXIT_ERROR, failed=True)
            comm.abort(EXIT_ERROR)
        if message is None:
            raise
        return EXIT_ERROR
    if run.unfinished is not None:  # outputs written, then a metric that raised: one line
        message = _user_message(args, comm, run.unfinished, run.output_dir) or \
            str(run.unfinished)
        if comm.is_root:
            print(f"meta: error: {message}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    return EXIT_PASS if outcome.passed else EXIT_FAIL


def cmd_inspect(args: argparse.Namespace) -> int:
    """``meta inspect``: load an ONNX model and print its summary (inputs, parameters, nodes, what
    an executor would need)."""
    from meta.lv1 import GraphError, from_onnx
    from meta.lv1.summary import summarize

    try:
        with warnings.catch_warnings():  # its notes are printed with the summary
            warnings.simplefilter("ignore")
            graph = from_onnx(args.model, check_operators=False, trainable=args.trainable,
                              frozen=args.frozen)
    except (GraphError, OSError) as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.precision != "f32" and not args.plan:
        print(f"meta: error: inspect --precision {args.precision} says what a plan computes "
              f"in: give --plan too", file=sys.stderr)
        return EXIT_ERROR
    print(summarize(graph, limit=0 if args.all else 40))
    if args.plan:  # where each node runs in a plan, and what Python steps cost
        from meta.lv1.plan.inspect_plan import report

        try:
            dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
        except ValueError:
            print(f"meta: error: --dim takes NAME=INTEGER, got {args.dim}", file=sys.stderr)
            return EXIT_ERROR
        try:
            print(report(graph, dims, precision=args.precision))
        except (GraphError, ValueError) as err:
            print(f"meta: error: --plan: {err}", file=sys.stderr)
            return EXIT_ERROR
    return EXIT_PASS


def cmd_components(args: argparse.Namespace) -> int:
    """The components a recipe can name, with their options (``meta components optimizer``)."""
    from meta.common.component import unknown
    from meta.run.recipe import registry

    kinds = {"model": "model", "dataset": "dataset", "optimizer": "optimizer",
             "executor": "executor", "distributed": "strategy", "events": "event",
             "metrics": "metric"}
    chosen = [args.kind] if args.kind else list(kinds)
    wrong = [k for k in chosen if k not in kinds]
    if wrong:
        print(f"meta: error: {unknown(wrong[0], kinds, 'component kind')}", file=sys.stderr)
        return EXIT_ERROR
    for key in chosen:
        print(f"== {key}")
        for component in registry(kinds[key]).entries.values():
            print(component.describe())
    return EXIT_PASS


def recipe_summary(path) -> str:
    """A recipe's first docstring sentence, on one line, read without running the recipe (which
    may register components)."""
    import ast
    import re

    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    text = " ".join(doc.split("\n\n")[0].split()).replace("``", "")
    match = re.match(r"(.+?(?<! al)(?<!e\.g)(?<!i\.e)[.!?])(\s|$)", text)  # not at "et al."
    return match.group(1) if match else text


def cmd_recipes(args: argparse.Namespace) -> int:
    """The shipped recipes, one line each: ``meta run NAME`` runs one from any folder."""
    from meta.run.recipe import SHIPPED, shipped_recipes

    shipped = shipped_recipes()
    print(f"{len(shipped)} recipes in {SHIPPED.resolve()} (meta run NAME; a path runs yours)")
    width = max(map(len, shipped), default=0)
    for name, path in shipped.items():
        print(f"{name:<{width}}  {recipe_summary(path)}")
    return EXIT_PASS


def cmd_ops(args: argparse.Namespace) -> int:
    """``meta ops``: every registered operator with its domain, opset version and backends."""
    from meta.lv0 import entries

    rows = {}
    for e in entries():
        key = (e.domain or "ai.onnx", e.op_type, e.since)
        rows.setdefault(key, []).append(e.backend)
    print(f"{'domain':<10} {'op':<26} {'since':>5}  backends")
    for (domain, op, since), backends in rows.items():
        print(f"{domain:<10} {op:<26} {since:>5}  {', '.join(backends)}")
    return EXIT_PASS


def cmd_check_op(args: argparse.Namespace) -> int:
    """Validate one operator on random inputs: forward vs onnx.reference, backward vs finite
    differences. Exit 0 on PASS, 1 on FAIL, 2 on bad usage."""
    import difflib

    import numpy as np

    from meta.lv0 import UnknownOperatorError, entries, lookup
    from meta.lv0.registry import load_operator_file
    from meta.lv0.validate import NEWEST_OPSET, validate_operator

    def usage(message: str) -> int:
        print(f"meta: error: {message}", file=sys.stderr)
        return EXIT_ERROR

    oracles = {}
    if args.module:
        module, problem = load_operator_file(args.module)
        if module is None:
            return usage(problem)
        oracles = getattr(module, "ORACLES", {})
    try:
        cls = lookup(args.op, args.opset or NEWEST_OPSET, args.domain, (args.backend,))
    except UnknownOperatorError as err:
        known = sorted({e.op_type for e in entries() if e.domain == args.domain})
        close = difflib.get_close_matches(args.op, known, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return usage(f"{err}{hint}")
    if cls.backend != args.backend:  # lookup falls back to numpy: say so, check nothing
        have = sorted({e.backend for e in entries() if e.op_type == args.op
                       and e.domain == cls.domain and e.since == cls.since})
        return usage(f"check-op {args.op} --backend {args.backend}: {args.op} (opset "
                     f"{cls.since}) has no {args.backend!r} implementation; it has "
                     f"{', '.join(have)} (bench-op --backend planned compares the planned "
                     f"executor's outputs and gradients with numpy's)")
    try:
        shapes = [tuple(int(d) for d in s.split(",") if d.strip()) for s in args.shape] or [(2, 3)]
        low, high = (float(v) for v in args.range.split(","))
        dtype = np.dtype(args.dtype)
    except (ValueError, TypeError) as err:
        return usage(f"bad --shape, --range or --dtype: {err}")
    attrs = {}
    for pair in args.attr:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            return usage(f"--attr expects KEY=VALUE, got {pair!r}")
        attrs[key.strip()] = attr_value(value.strip())
    problem = input_problem(cls, len(shapes))
    if problem:
        return usage(problem)
    rng = np.random.default_rng(args.seed)
    inputs = [rng.uniform(low, high, s).astype(dtype) for s in shapes]
    oracle = oracles.get(args.op)
    unchecked = bool(cls.domain) and oracle is None  # onnx.reference knows no custom domain
    try:
        report = validate_operator(cls, inputs, attrs, opset=args.opset, oracle=oracle,
                                   check_forward=not unchecked)
    except TypeError as err:  # unknown attribute
        return usage(str(err))
    if unchecked and report.forward_problem == "check_forward=False":
        report.forward_problem = "--no-forward" if args.no_forward else (
            f"no oracle: give --module a file with ORACLES = {{{args.op!r}: oracle}}, "
            f"oracle(inputs, attrs) -> outputs, or pass --no-forward")
    head, _, rest = str(report).partition("\n")
    domain = f"{cls.domain}::" if cls.domain else ""
    text = (f"{head}\n  implementation checked: {domain}{cls.op_type}-{cls.since}"
            f"[{cls.backend}] ({cls.__module__}.{cls.__qualname__})" + (f"\n{rest}" if rest
                                                                        else ""))
    if unchecked and not args.no_forward and report.passed:
        # Half a check is not a PASS: the verdict says what is missing (exit 1).
        head, _, rest = text.partition("\n")
        text = f"{head.removesuffix(': PASS')}: forward not checked\n{rest}"
        print(text)
        return EXIT_FAIL
    print(text)
    return EXIT_PASS if report.passed else EXIT_FAIL


def input_problem(cls, given: int) -> str:
    """Why ``given`` inputs do not suit ``cls.forward``, naming the inputs it takes (check-op
    gives one random array per --shape), or "" when they do."""
    import inspect

    params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, ctx
    required = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    optional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is not p.empty]
    variadic = [p.name for p in params if p.kind is p.VAR_POSITIONAL]
    if len(required) <= given and (variadic or given <= len(required) + len(optional)):
        return ""
    names = [*required, *(f"[{n}]" for n in optional), *(f"{n}..." for n in variadic)]
    count = (f"{len(required)}" + (f" to {len(required) + len(optional)}" if optional else "")
             + (" or more" if variadic else ""))
    return (f"{cls.op_type} takes {count} input(s): {', '.join(names)}; give one --shape per "
            f"input ({given} given)")


def cmd_launch(args: argparse.Namespace) -> int:
    """``meta run`` under mpiexec, restarted from its checkpoint when a rank dies."""
    from meta.run.launch import Launch, LaunchError

    # The run options are checked here, once, rather than by N ranks after they started.
    run_args = make_parser().parse_args(["run", args.recipe, *args.run_args])
    try:
        job = Launch(args.recipe, args.n, args.max_restarts, args.run_args,
                     output_dir=run_args.output_dir, mpiexec_args=args.mpiexec_arg)
        job.command(resume=False)  # finds mpiexec before anything starts
    except (LaunchError, ValueError) as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    return job.run()


def cmd_replay(args: argparse.Namespace) -> int:
    """Recompute an asynchronous run on one process in its recorded update order."""
    from meta.run.replay import ReplayError, replay

    try:
        done = replay(args.run_dir)
    except ReplayError as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.save:
        import numpy as np

        from meta.common.files import atomic_write

        with atomic_write(args.save, "wb") as f:
            np.savez(f, **done.params)
    verdict = "bit-identical to the run's" if done.identical else \
        f"DIFFERENT from the run's in {', '.join(done.differing)}"
    print(f"meta replay: {done.updates} updates replayed in {done.seconds:.1f} s; final "
          f"weights {verdict} ({len(done.params)} tensors, sha256)")
    return EXIT_PASS if done.identical else EXIT_FAIL


def make_parser() -> argparse.ArgumentParser:
    """The ``meta`` command line: every subcommand with its options."""
    parser = _Parser(prog="meta", description="meta: a deep-learning meta-framework")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a recipe, report its metrics, PASS or FAIL (exit 1)")
    run.add_argument("recipe", help="recipe file, e.g. recipes/mnist_mlp.py, or the name of a "
                     "shipped recipe, e.g. mnist_mlp (`meta recipes` lists them)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a MUTABLE definition (repeatable)")
    run.add_argument("--output-dir", metavar="DIR",
                     help="where metrics.json and model.onnx go (default: runs/<recipe>)")
    run.add_argument("--no-export", action="store_true", help="do not write model.onnx")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--checkpoint-every", type=_count, default=0, metavar="STEPS",
                     help="also checkpoint every STEPS steps (always after each epoch)")
    run.add_argument("--resume", action="store_true",
                     help="continue from the output dir's checkpoint.npz")
    run.add_argument("--repeat", type=_count, default=0, metavar="N",
                     help="run N times; write report.json and plots of step times and losses")
    run.add_argument("--debug", action="store_true",
                     help="also print the full traceback of an error (always kept in the "
                     "output folder's error.log)")
    add_run_options(run)
    run.set_defaults(func=cmd_run)
    inspect = sub.add_parser("inspect", help="what an ONNX model holds: inputs, outputs, "
                             "operators and their support, parameters, state and constants")
    inspect.add_argument("model", help="an .onnx file")
    inspect.add_argument("--trainable", action="append", default=[], metavar="PATTERN",
                         help="train only the initializers matching PATTERN (repeatable)")
    inspect.add_argument("--frozen", action="append", default=[], metavar="PATTERN",
                         help="freeze the parameters matching PATTERN (repeatable)")
    inspect.add_argument("--all", action="store_true", help="list every tensor of each role")
    inspect.add_argument("--plan", action="store_true", help="also where each node runs in "
                         "the planned executor and, timed on a few training steps on random "
                         "feeds, its share of a step and the share in Python steps")
    inspect.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                         help="a symbolic input dimension's size for --plan (default 1)")
    inspect.add_argument("--precision", default="f32", choices=PRECISIONS,
                         help="with --plan: plan at this precision (bf16: matrix products "
                         "and convolutions read bf16); each node's precision is listed")
    inspect.set_defaults(func=cmd_inspect)
    components = sub.add_parser("components", help="the models, datasets, optimizers, "
                                "executors, strategies, events and metrics a recipe can name, "
                                "with their options")
    components.add_argument("kind", nargs="?", help="model, dataset, optimizer, executor, "
                            "distributed, events or metrics (default: all)")
    components.set_defaults(func=cmd_components)
    recipes = sub.add_parser("recipes", help="list the shipped recipes (meta run NAME runs one "
                             "from any folder)")
    recipes.set_defaults(func=cmd_recipes)
    ops = sub.add_parser("ops", help="list the registered operators and their backends")
    ops.set_defaults(func=cmd_ops)
    check = sub.add_parser("check-op", help="validate an operator on random inputs: forward "
                           "vs onnx.reference, backward vs finite differences")
    check.add_argument("op", help="op type, e.g. Relu")
    check.add_argument("--shape", action="append", default=[], metavar="D1,D2,...",
                       help="shape of one input (repeat per input; default one 2,3 input)")
    check.add_argument("--opset", type=int, help="opset (default: the newest it serves)")
    check.add_argument("--attr", action="append", default=[], metavar="KEY=VALUE",
                       help="an attribute (repeatable; ints, floats, comma lists, strings)")
    check.add_argument("--dtype", default="float32", help="input dtype (default float32)")
    check.add_argument("--range", default="-2,2", metavar="LOW,HIGH",
                       help="inputs are uniform in this range (default -2,2)")
    check.add_argument("--domain", default="", help="operator domain (custom ops)")
    check.add_argument("--module", metavar="FILE.py", help="import this file first (it "
                       "registers custom ops; an ORACLES dict maps op type to an oracle, "
                       "oracle(inputs, attrs) -> outputs)")
    check.add_argument("--no-forward", action="store_true", help="a custom op without an "
                       "oracle: check the backward only and call that a PASS")
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--backend", default="numpy", help="the registered implementation to "
                       "check (default numpy; native: the C++ twin, where there is one); "
                       "the check's second line names the class checked")
    check.set_defaults(func=cmd_check_op)
    launch = sub.add_parser("launch", help="meta run under mpiexec -n N; a job whose rank died "
                            "restarts from its checkpoint (torchrun's --max-restarts)")
    launch.add_argument("-n", type=int, required=True, metavar="N", help="ranks")
    launch.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart a job whose rank died up to K times (default 0)")
    launch.add_argument("--mpiexec-arg", action="append", default=[], metavar="ARG",
                        help="pass ARG to mpiexec (repeatable; --mpiexec-arg=-bind-to=core)")
    launch.add_argument("recipe", help="recipe file, e.g. recipes/mnist_mlp.py")
    launch.add_argument("run_args", nargs=argparse.REMAINDER, metavar="...",
                        help="meta run's options (--set, --output-dir, --checkpoint-every ...)")
    launch.set_defaults(func=cmd_launch)
    replay = sub.add_parser("replay", help="recompute an asynchronous run on one process in "
                            "the order its server applied the updates; exit 1 unless the final "
                            "weights are bit-identical to the run's")
    replay.add_argument("run_dir", help="the run's output folder (with replay.json)")
    replay.add_argument("--save", metavar="FILE.npz", help="write the replayed weights")
    replay.set_defaults(func=cmd_replay)
    add_bench_commands(sub)  # compare, bench-op
    from meta.planner.command import add_plan_parser

    add_plan_parser(sub)  # meta plan: predict and rank strategies (meta/planner/)
    from meta.run.sample import add_sample_parser

    add_sample_parser(sub)  # meta sample: text from a trained language model
    from meta.run.evaluate import add_eval_parser

    add_eval_parser(sub)  # meta eval: a saved model on a recipe's test split
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``meta`` command with ``argv`` (default: the process's); returns the exit status."""
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `meta recipes | head`: the reader left, as with any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_PASS


if __name__ == "__main__":
    sys.exit(main())
