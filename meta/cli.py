"""The ``meta`` command line: ``meta run RECIPE``, ``meta inspect MODEL.onnx``, ``meta ops``,
``meta check-op OP``."""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from typing import Sequence

from meta.bench.commands import add_commands as add_bench_commands
from meta.bench.commands import add_run_options

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"meta: error: --set expects KEY=VALUE, got {pair!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def _prepare(args: argparse.Namespace, comm, locks: list):
    """(RecipeRun, None) or (None, the input error's message) on this rank. Rank 0 first
    takes the output folder's lock (appended to ``locks``): one run per folder."""
    from meta.component import ComponentError
    from meta.lv1 import GraphError
    from meta.lv2 import CheckpointError, DatasetError
    from meta.recipe import RecipeError, load_recipe
    from meta.run_dir import RunDirError, RunLock, output_folder
    from meta.runner import RecipeRun

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
        return None, str(err)


def cmd_run(args: argparse.Namespace) -> int:
    from meta.lv3 import world

    comm, locks = world(), []
    try:
        code = _run(args, comm, locks)
    finally:  # also on exit 2 and Ctrl-C; a killed run leaves a lock the next run takes over
        for lock in locks:
            lock.release()
    from meta.lv3.survival import end_without_finalize_after_a_death

    end_without_finalize_after_a_death(code)
    return code


def _run(args: argparse.Namespace, comm, locks: list) -> int:
    from meta.run_dir import training_error

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
    from meta.lv3.agreement import AgreementError, agree_on, run_payload

    try:  # the ranks run one recipe, with the same definitions and data, or none starts
        agree_on(comm, run_payload(run.recipe.name, run.recipe.definitions.as_dict(),
                                   run.trainer, run.resumed))
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
        message = training_error(run, err)  # a NaN loss, a bad backward, a full disk: one line
        if message is None:  # a rank died (MPI with ULFM) where the run cannot survive it
            from meta.lv3.survival import failure_message

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
            comm.abort(EXIT_ERROR)
        if message is None:
            raise
        return EXIT_ERROR
    return EXIT_PASS if outcome.passed else EXIT_FAIL


def cmd_inspect(args: argparse.Namespace) -> int:
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
    print(summarize(graph, limit=0 if args.all else 40))
    return EXIT_PASS


def cmd_components(args: argparse.Namespace) -> int:
    """The components a recipe can name, with their options (``meta components optimizer``)."""
    from meta.component import unknown
    from meta.recipe import registry

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


def cmd_ops(args: argparse.Namespace) -> int:
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
    import importlib.util

    import numpy as np

    from meta.lv0 import UnknownOperatorError, entries, lookup
    from meta.lv0.validate import NEWEST_OPSET, validate_operator

    def usage(message: str) -> int:
        print(f"meta: error: {message}", file=sys.stderr)
        return EXIT_ERROR

    oracles = {}
    if args.module:
        spec = importlib.util.spec_from_file_location("meta_user_ops", args.module)
        if spec is None or spec.loader is None:
            return usage(f"--module {args.module}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except (OSError, SyntaxError, ImportError) as err:
            return usage(f"--module {args.module}: cannot import it ({err})")
        oracles = getattr(module, "ORACLES", {})
    try:
        cls = lookup(args.op, args.opset or NEWEST_OPSET, args.domain)
    except UnknownOperatorError as err:
        known = sorted({e.op_type for e in entries() if e.domain == args.domain})
        close = difflib.get_close_matches(args.op, known, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return usage(f"{err}{hint}")
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
        attrs[key.strip()] = _attr_value(value.strip())
    rng = np.random.default_rng(args.seed)
    inputs = [rng.uniform(low, high, s).astype(dtype) for s in shapes]
    oracle = oracles.get(args.op)
    try:
        report = validate_operator(cls, inputs, attrs, opset=args.opset, oracle=oracle,
                                   check_forward=not cls.domain or oracle is not None)
    except TypeError as err:  # unknown attribute
        return usage(str(err))
    print(report)
    return EXIT_PASS if report.passed else EXIT_FAIL


def cmd_launch(args: argparse.Namespace) -> int:
    """``meta run`` under mpiexec, restarted from its checkpoint when a rank dies."""
    from meta.launch import Launch, LaunchError

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
    from meta.replay import ReplayError, replay

    try:
        done = replay(args.run_dir)
    except ReplayError as err:
        print(f"meta: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    if args.save:
        import numpy as np

        from meta.files import atomic_write

        with atomic_write(args.save, "wb") as f:
            np.savez(f, **done.params)
    verdict = "bit-identical to the run's" if done.identical else \
        f"DIFFERENT from the run's in {', '.join(done.differing)}"
    print(f"meta replay: {done.updates} updates replayed in {done.seconds:.1f} s; final "
          f"weights {verdict} ({len(done.params)} tensors, sha256)")
    return EXIT_PASS if done.identical else EXIT_FAIL


def _attr_value(text: str):
    """An --attr value: int, float, a comma list of them, or a string."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    if "," in text:
        return [_attr_value(t) for t in text.split(",")]
    return text


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meta",
                                     description="meta: a deep-learning meta-framework")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a recipe, report its metrics, PASS or FAIL (exit 1)")
    run.add_argument("recipe", help="recipe file, e.g. recipes/mnist_mlp.py")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a MUTABLE definition (repeatable)")
    run.add_argument("--output-dir", metavar="DIR",
                     help="where metrics.json and model.onnx go (default: runs/<recipe>)")
    run.add_argument("--no-export", action="store_true", help="do not write model.onnx")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                     help="also checkpoint every STEPS steps (always after each epoch)")
    run.add_argument("--resume", action="store_true",
                     help="continue from the output dir's checkpoint.npz")
    run.add_argument("--repeat", type=int, default=0, metavar="N",
                     help="run N times; write report.json and plots of step times and losses")
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
    inspect.set_defaults(func=cmd_inspect)
    components = sub.add_parser("components", help="the models, datasets, optimizers, "
                                "executors, strategies, events and metrics a recipe can name, "
                                "with their options")
    components.add_argument("kind", nargs="?", help="model, dataset, optimizer, executor, "
                            "distributed, events or metrics (default: all)")
    components.set_defaults(func=cmd_components)
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
                       "registers custom ops; an ORACLES dict maps op type to an oracle)")
    check.add_argument("--seed", type=int, default=0)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
