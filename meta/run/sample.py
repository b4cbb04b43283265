"""``meta sample RUN_DIR|MODEL.onnx --prompt TEXT``: text from a trained language model.

What a finished run left is enough: model.onnx and the tokenizer saved beside it (or in the
model's metadata, ``meta.lv2.tokenizers``); the corpus is not read. The model runs on the
planned executor. GPTs meta built decode with a key/value cache (``meta.lv2.kv_cache``) while
the text fits their context; other language models recompute the window per token (a note says
so). Mistakes are one line and exit status 2: a folder without a model, a model
without a tokenizer, a prompt character outside the vocabulary.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

import numpy as np

EXIT_PASS, EXIT_ERROR = 0, 2


class SampleError(ValueError):
    """What ``meta sample`` was given cannot be sampled from; the message names it."""


def _model_path(source: str) -> Path:
    path = Path(source)
    if path.is_dir():
        if not (path / "model.onnx").is_file():
            raise SampleError(f"{path} has no model.onnx: the run has not finished, or ran "
                              "with --no-export")
        return path / "model.onnx"
    if not path.is_file():
        raise SampleError(f"{path}: no such run folder or model file")
    return path


def _model_vocab(graph: Any) -> int | None:
    out = next((t for t in graph.outputs if t.name == "logits"), None)
    shape = getattr(out, "shape", None)
    return shape[1] if shape and len(shape) == 3 and isinstance(shape[1], int) else None


def _executor(graph: Any, notes: TextIO | None) -> Any:
    """The planned executor (compiled kernels: a window past the context costs milliseconds);
    the reference executor, with a note, for a graph it cannot plan."""
    from meta.lv1 import GraphError, ReferenceExecutor
    from meta.lv1.plan import PlannedExecutor

    try:
        return PlannedExecutor(graph)
    except (GraphError, NotImplementedError, ValueError) as err:
        print(f"meta: note: the planned executor cannot run this model ({err}); using the "
              "reference executor", file=notes or sys.stderr, flush=True)
        return ReferenceExecutor(graph)


def sample(source: str, prompt: str, tokens: int, temperature: float = 0.8, top_k: int = 0,
           seed: int = 0, cache: bool = True, notes: TextIO | None = None) -> str:
    """The prompt and ``tokens`` sampled tokens, decoded: ``source`` is a run folder or an
    ONNX model holding a tokenizer."""
    from meta.lv1 import GraphError, from_onnx
    from meta.lv2.generate import generate
    from meta.lv2.kv_cache import CacheError
    from meta.lv2.tokenizers import load_tokenizer

    model = _model_path(source)
    tokenizer = load_tokenizer(source)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a loader's notes: not a sampler's business
            graph = from_onnx(model)
    except (GraphError, OSError) as err:
        raise SampleError(f"{model}: {err}") from err
    vocab = _model_vocab(graph)
    if vocab is not None and vocab > len(tokenizer):
        raise SampleError(f"{model}: the model scores {vocab} tokens, its tokenizer knows "
                          f"{len(tokenizer)}")
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as err:
        raise SampleError(f"--prompt: {err}") from None
    if vocab is not None and len(ids) and int(ids.max()) >= vocab:
        bad = prompt if tokenizer.kind != "char" else \
            next(c for c in prompt if int(tokenizer.encode(c)[0]) >= vocab)
        raise SampleError(f"--prompt: {bad!r} is never a next token in the training text, so "
                          f"the model (vocabulary {vocab}) has no embedding for it")
    executor = _executor(graph, notes)
    rng = np.random.default_rng(seed)
    try:
        out = generate(executor, ids, tokens, temperature, top_k, rng, cache=cache)
    except CacheError as err:
        print(f"meta: note: {err}; recomputing the window for each token",
              file=notes or sys.stderr, flush=True)
        out = generate(executor, ids, tokens, temperature, top_k, rng)
    if not len(ids):
        out = out[1:]  # generate starts an empty prompt from token 0: not the user's text
    return tokenizer.decode(out)


def _nonnegative(kind: type):
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
        if not value >= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
        return value
    return parse


def cmd_sample(args: argparse.Namespace) -> int:
    """``meta sample``: print the text; one line and exit 2 for a mistake."""
    from meta.lv2.bpe import MissingLibraryError
    from meta.lv2.tokenizers import TokenizerError

    try:
        text = sample(args.source, args.prompt, args.tokens, args.temperature, args.top_k,
                      args.seed, cache=not args.no_cache)
    except (SampleError, TokenizerError, MissingLibraryError) as err:
        print(f"meta: error: {err}", file=sys.stderr, flush=True)
        return EXIT_ERROR
    print(text, flush=True)
    return EXIT_PASS


def add_sample_parser(sub: Any) -> None:
    """The ``sample`` subcommand on ``meta``'s subparsers."""
    p = sub.add_parser("sample", help="text from a trained language model: a run folder or "
                       "its model.onnx, from a prompt (no corpus needed)")
    p.add_argument("source", metavar="RUN_DIR|MODEL.onnx",
                   help="a finished run's output folder, or a model.onnx meta wrote")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--tokens", type=_nonnegative(int), default=200, metavar="N",
                   help="tokens to generate (default 200)")
    p.add_argument("--temperature", type=_nonnegative(float), default=0.8, metavar="T",
                   help="softmax temperature; 0 picks the most likely token (default 0.8)")
    p.add_argument("--top-k", type=_nonnegative(int), default=0, metavar="K",
                   help="draw among the K most likely tokens (default 0: all)")
    p.add_argument("--seed", type=int, default=0, help="seeds the draws (default 0)")
    p.add_argument("--no-cache", action="store_true", help="recompute the window for each "
                   "token instead of keeping keys and values (slower; the same tokens)")
    p.set_defaults(func=cmd_sample)
