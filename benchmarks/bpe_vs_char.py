"""The shakespeare_gpt recipe with characters against byte-level BPE subwords, at equal steps.

Run:  python benchmarks/bpe_vs_char.py [--blocks 6400 --vocab-size 1024 --validation 0.02]

Both runs train the recipe's GPT (2 layers, 4 heads, width 128, a context of 64 tokens) with
its optimizer for one epoch on the first ``--blocks`` training blocks at batch 32 (the same
number of steps), once on characters, once on a BPE vocabulary of ``--vocab-size`` tokens
learnt from the corpus (``tokenizer: "bpe"``). A loss per token is not comparable between
them: each validation loss is converted to nats per character with the validation targets'
characters per token (their tokens decoded and counted), and printed with bits per character.
The two validation sets are seeded draws of each encoding's blocks: the same share of the
text, not the same passages. Needs Tiny Shakespeare (``$META_TINYSHAKESPEARE_DIR``) and the
``text`` extra.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import runpy
import time
from pathlib import Path

from meta.lv2 import DATASETS, build_dataset
from meta.lv2.text import characters_per_token
from meta.lv3 import SingleProcessCommunicator
from meta.run.recipe import make_recipe
from meta.run.runner import run_recipe

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "shakespeare_gpt.py"


def run(tokenizer: str, args: argparse.Namespace, out: Path) -> dict:
    spec = runpy.run_path(str(RECIPE))
    fixed = {**spec["FIXED"], "events": []}  # no samples: only the losses are compared
    fixed["dataset"] = {**fixed["dataset"], "tokenizer": tokenizer,
                        **({"vocab_size": args.vocab_size} if tokenizer == "bpe" else {})}
    mutable = {**spec["MUTABLE"], "dataset.train_samples": args.blocks,
               "dataset.validation": args.validation}
    recipe = make_recipe(f"shakespeare_gpt_{tokenizer}", fixed, mutable, spec["METRICS"])
    start = time.perf_counter()
    outcome = run_recipe(recipe, SingleProcessCommunicator(), stream=io.StringIO(),
                         progress=False, export_onnx=False, output_dir=out / tokenizer)
    seconds = time.perf_counter() - start
    options = {k: v for k, v in fixed["dataset"].items() if k != "name"}
    _, test, _ = build_dataset(DATASETS["text"], {**options, "validation": args.validation},
                               seed=mutable["seed"])
    per_token = outcome.metrics["test_loss"]
    ratio = characters_per_token(test)
    return {"tokenizer": tokenizer, "vocab": len(test.vocabulary),
            "steps": math.ceil(args.blocks / mutable["batch_size"]),
            "loss_per_token": per_token, "chars_per_token": ratio,
            "loss_per_char": per_token / ratio, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6400, help="training blocks (steps x 32)")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--validation", type=float, default=0.02)
    parser.add_argument("--output", default="runs/bpe_vs_char")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores visible, load {os.getloadavg()[0]:.1f}; {args.blocks} "
          f"blocks of 64 tokens, batch 32, one epoch; validation {args.validation:.0%}")
    rows = [run(t, args, Path(args.output)) for t in ("char", "bpe")]
    print(f"{'tokenizer':10}{'vocab':>7}{'steps':>7}{'nats/token':>12}{'chars/token':>13}"
          f"{'nats/char':>11}{'bits/char':>11}{'time s':>9}")
    for r in rows:
        print(f"{r['tokenizer']:10}{r['vocab']:>7}{r['steps']:>7}{r['loss_per_token']:>12.4f}"
              f"{r['chars_per_token']:>13.3f}{r['loss_per_char']:>11.4f}"
              f"{r['loss_per_char'] / math.log(2):>11.4f}{r['seconds']:>9.0f}")
    better = rows[1]["loss_per_char"] <= rows[0]["loss_per_char"]
    print(f"BPE at least as good per character as characters at equal steps: {better}")


if __name__ == "__main__":
    main()
