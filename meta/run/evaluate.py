"""``meta eval RECIPE --model RUN_DIR|MODEL.onnx``: a saved model measured on a recipe's test
split, without training.

The recipe builds its data and its network as ``meta run`` does; the network's parameters and
state are then read from the model file (a run folder's model.onnx, or any model.onnx meta
wrote for this recipe's network), every one of them by name and shape: a model of another
network is refused in one line naming the first tensor that differs, never evaluated with some
weights left at their initial values. The recipe's METRICS that an evaluation measures (test
loss and accuracy, metric components such as top-k accuracy) are judged; those only training
measures (train_loss, train_time_s, ...) are listed as not measured. Exit 0 PASS, 1 FAIL, 2 a
mistake (one line).

A run folder's model is evaluated at the run's precision (``executor.precision`` in its
metrics.json, issue 42): a bf16 run's test metrics again in bf16, as ``meta run`` measured
them, unless ``--set precision=...`` says otherwise; one line says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np

EXIT_PASS, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
TRAINING_ONLY = ("train_loss", "train_accuracy", "train_time_s", "samples_per_s",
                 "bytes_sent_per_step", "pretrain_time_s")


class EvalError(ValueError):
    """The model cannot be evaluated with this recipe; the message names why."""


def model_file(source: str | Path) -> Path:
    """The model file ``source`` names: a run folder's model.onnx, or the file itself."""
    path = Path(source)
    if path.is_dir():
        if not (path / "model.onnx").is_file():
            raise EvalError(f"{path} has no model.onnx: the run has not finished, or ran with "
                            "--no-export")
        return path / "model.onnx"
    if not path.is_file():
        raise EvalError(f"--model {path}: no such run folder or model file")
    return path


def saved_model(path: Path) -> tuple[dict[str, np.ndarray], Any]:
    """The initializers of the ONNX model at ``path``, by name, and the tokenizer saved in its
    metadata (a language model's), or None."""
    import onnx
    from onnx import numpy_helper

    from meta.lv2.tokenizers import TokenizerError, model_tokenizer

    try:
        model = onnx.load(str(path))
    except Exception as err:  # noqa: BLE001 - protobuf's errors name no file
        raise EvalError(f"{path}: not an ONNX model ({type(err).__name__}: {err})") from err
    try:
        tokenizer = model_tokenizer(model, str(path))
    except TokenizerError as err:
        raise EvalError(str(err)) from None
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}, tokenizer


def check_tokenizer(saved: Any, data: Any, path: Path) -> None:
    """A language model is evaluated on tokens as it was trained on them: the tokenizer saved
    in its model and the one the recipe's dataset built must be the same (two corpora can give
    vocabularies of one size and other symbols: the shapes would fit, the ids would not)."""
    from meta.lv2.tokenizers import tokenizer_json

    built = getattr(data, "vocabulary", None)
    if saved is not None and built is not None and tokenizer_json(saved) != tokenizer_json(built):
        raise EvalError(f"{path}: the model's tokenizer ({saved.kind}, {len(saved)} tokens) is "
                        f"not the one the recipe's dataset built ({built.kind}, {len(built)} "
                        f"tokens): it was trained on other text or another tokenizer")


def load_weights(graph: Any, saved: dict[str, np.ndarray], path: Path) -> int:
    """Copy every parameter and state tensor of ``graph`` from ``saved`` (same name, same
    shape); returns how many. One missing or of another shape is an EvalError."""
    wanted = {**dict(graph.parameters.items()), **dict(graph.state.items())}
    for name, array in wanted.items():
        if name not in saved:
            raise EvalError(f"{path} has no tensor {name!r}, which the recipe's network has: "
                            f"it is not a model of this recipe's network")
        if tuple(saved[name].shape) != tuple(array.shape):
            raise EvalError(f"{path}: tensor {name!r} is {list(saved[name].shape)}, the "
                            f"recipe's network has {list(array.shape)}")
        array[...] = saved[name].astype(array.dtype, copy=False)
    graph.touch()
    return len(wanted)


PRECISION_KEYS = ("precision", "executor.precision")  # the --set keys that name it


def with_run_precision(recipe: Any, source: str | Path, sets: dict[str, str],
                       stream: TextIO) -> Any:
    """``recipe`` at the precision the run in folder ``source`` trained in (its metrics.json's
    ``executor.precision``), said in one line, where ``sets`` names none and it differs from
    the recipe's; else ``recipe``."""
    import json

    metrics = Path(source) / "metrics.json"
    if any(k in sets for k in PRECISION_KEYS) or not metrics.is_file():
        return recipe
    try:
        ran = json.loads(metrics.read_text()).get("definitions", {}).get("executor.precision")
    except (OSError, ValueError, AttributeError):
        return recipe
    ours = recipe.definitions.choices["executor"].values().get("precision")
    if ran is None or ours is None or ran == ours:
        return recipe
    print(f"meta: evaluating at the run's precision, {ran} ({metrics}; --set precision=... "
          f"to change it)", file=stream, flush=True)
    return recipe.with_overrides({"executor.precision": ran})


def evaluate(recipe: Any, source: str | Path, stream: TextIO) -> Any:
    """The recipe's test metrics of the model ``source`` names, judged (an ``Outcome``)."""
    from meta.lv2 import ShuffleSampler, Trainer, Updater
    from meta.lv3 import SingleProcessCommunicator
    from meta.run.data_and_model import build_data_and_model, io_names
    from meta.run.recipe import judge
    from meta.run.recipe_metrics import measure

    path = model_file(source)
    saved, tokenizer = saved_model(path)
    d = recipe.definitions
    built = build_data_and_model(recipe, stream, True)
    check_tokenizer(tokenizer, built.train, path)
    count = load_weights(built.graph, saved, path)
    print(f"meta: evaluating {path} ({count} tensors) on recipe {recipe.name}'s test split "
          f"({len(built.test)} examples)", file=stream, flush=True)
    executor = d.choices["executor"].build(built.graph)
    trainer = Trainer(executor, Updater(None), built.train,
                      ShuffleSampler(len(built.train), d.batch_size, d.seed), built.test,
                      eval_batch_size=d.eval_batch_size, names=io_names(built.graph))
    start = time.perf_counter()
    metrics = trainer.evaluate(built.test, prefix="test_")
    metrics["eval_time_s"] = time.perf_counter() - start
    measured, failed = measure(recipe.metrics, trainer, [metrics], True,
                               SingleProcessCommunicator())
    if failed is not None:
        raise failed
    metrics.update(measured)
    metrics = {k: float(v) for k, v in metrics.items()}
    skipped = [k for k in recipe.metrics if k not in metrics]
    if skipped:
        print(f"meta: not measured without training: {', '.join(skipped)}", file=stream,
              flush=True)
    judged = replace(recipe, metrics={k: t for k, t in recipe.metrics.items() if k in metrics})
    return judge(judged, metrics, [metrics], dict(built.graph.parameters.items()))


def cmd_eval(args: argparse.Namespace) -> int:
    """``meta eval``: print the metrics table; exit 0 PASS, 1 FAIL, 2 a mistake."""
    from meta.common.component import ComponentError
    from meta.lv1 import GraphError
    from meta.lv2 import DatasetError
    from meta.run.errors import user_error
    from meta.run.recipe import RecipeError, load_recipe, parse_sets

    try:
        sets = parse_sets(args.set or [])
        recipe = load_recipe(args.recipe).with_overrides(sets)
        recipe = with_run_precision(recipe, args.model, sets, sys.stdout)
        outcome = evaluate(recipe, args.model, sys.stdout)
    except (EvalError, RecipeError, ComponentError, DatasetError, GraphError) as err:
        print(f"meta: error: {user_error(err) or err}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    except Exception as err:
        message = user_error(err)
        if message is None:
            raise
        print(f"meta: error: {message}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    print(outcome.table(), flush=True)
    return EXIT_PASS if outcome.passed else EXIT_FAIL


def add_eval_parser(sub: Any) -> None:
    """The ``eval`` subcommand on ``meta``'s subparsers."""
    p = sub.add_parser("eval", help="measure a saved model on a recipe's test split, without "
                       "training: PASS or FAIL (exit 1) on the metrics it measures")
    p.add_argument("recipe", help="the recipe file (or a shipped recipe's name) whose data and "
                   "network the model is of")
    p.add_argument("--model", required=True, metavar="RUN_DIR|MODEL.onnx",
                   help="a finished run's output folder, or a model.onnx meta wrote")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="change a MUTABLE definition (eval_batch_size, ...)")
    p.set_defaults(func=cmd_eval)
