"""The ``meta`` command line: ``meta run RECIPE``, ``meta ops``."""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Sequence

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2


def _parse_sets(pairs: Sequence[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"meta: error: --set expects KEY=VALUE, got {pair!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def _prepare(args: argparse.Namespace, comm):
    """(RecipeRun, None) or (None, the input error's message) on this rank."""
    from meta.lv1 import GraphError
    from meta.lv2 import DatasetError
    from meta.recipe import RecipeError, load_recipe
    from meta.runner import RecipeRun

    try:
        recipe = load_recipe(args.recipe).with_overrides(_parse_sets(args.set))
        return RecipeRun(recipe, comm, output_dir=args.output_dir, progress=not args.quiet,
                         export_onnx=not args.no_export), None
    except (RecipeError, DatasetError, GraphError) as err:
        return None, str(err)


def cmd_run(args: argparse.Namespace) -> int:
    from meta.lv3 import world

    comm = world()
    run, error = _prepare(args, comm)
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
    try:
        outcome = run.execute()
    except Exception:
        if comm.size > 1:  # the other ranks may be waiting in a collective: end them all
            traceback.print_exc()
            print(f"meta: rank {comm.rank} failed; aborting all {comm.size} ranks",
                  file=sys.stderr, flush=True)
            comm.abort(EXIT_ERROR)
        raise
    return EXIT_PASS if outcome.passed else EXIT_FAIL


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
    run.set_defaults(func=cmd_run)
    ops = sub.add_parser("ops", help="list the registered operators and their backends")
    ops.set_defaults(func=cmd_ops)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
