"""Time to a validation loss: the Shakespeare GPT trained by meta's planned executor, by
PyTorch eager and by torch.compile, from the same weights on the same batches.

    python benchmarks/time_to_quality_gpt.py                   # threads 1 then 2, 3 runs each
    python benchmarks/time_to_quality_gpt.py --threads 1 --runs 2 --target 2.6 --json out.json

The model is ``recipes/shakespeare_gpt.py``'s (meta's ``gpt`` builder: 2 pre-LayerNorm blocks,
4 heads, width 128, context 64, output head tied to the token embedding) with its seed-0
weights; the PyTorch twin (``torch_models.GPT``, written as nanoGPT writes it: matrices
holding meta's arrays, ``F.scaled_dot_product_attention(is_causal=True)``, exact GELU, the
head tied to the embedding; ``F.cross_entropy`` here) starts from the same arrays, and the
first step's losses agree (printed). Every variant trains on the same batches in the same order (meta's seeded
``ShuffleSampler`` over Tiny Shakespeare's training blocks, batch 32) with AdamW (lr 2e-3,
betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.01 on every parameter, constant rate: the
recipe's cosine schedule and clipping are left out so that the target, not the schedule's
length, decides when a run stops). Every ``--eval-every`` steps the loss over the same 512
validation blocks is measured, outside the clock; a run's time to the target is its training
time (evaluations excluded) at the first evaluation at or below ``--target`` nats/character.

Each variant runs in a fresh process per thread count and run (two frameworks' thread pools in
one process slowed each other), the variants taking turns. The figure per variant is the median
over runs with its interval from meta's statistics (``meta.bench.stats``: the order-statistic
interval of the median; the ratio's percentile bootstrap), and the ratio PyTorch / meta (above
1: meta reaches the loss sooner). torch.compile's first steps compile: its time includes that,
as a user's run would, and the first step's time and the time after it are printed beside it.
Needs torch and Tiny Shakespeare (``META_TINYSHAKESPEARE_DIR``, or the download cache).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

VARIANTS = ("meta planned", "pytorch eager", "torch.compile")
MODEL = {"layers": 2, "heads": 4, "width": 128}
CONTEXT, BATCH, LR, WEIGHT_DECAY, VALIDATION_BLOCKS = 64, 32, 2e-3, 0.01, 512


def _data(seed: int = 0):
    from meta.lv2.text import text_dataset

    train, val = text_dataset(seed=seed, context=CONTEXT)
    x_val, y_val = val.batch(np.arange(min(VALIDATION_BLOCKS, len(val))))
    return train, x_val, y_val, len(train.vocabulary)


def _meta_variant(graph):
    from meta import lv1
    from meta.lv2 import Optimizer, adamw

    executor = lv1.EXECUTORS["planned"](graph)
    optimizer = Optimizer(adamw(LR, weight_decay=WEIGHT_DECAY), graph.parameters)

    def step(x, y) -> float:
        values, grads = executor.inference_and_backprop({"input": x, "labels": y})
        optimizer.step(grads)
        return float(values["loss"])

    def loss_of(x, y) -> float:
        executor.eval()
        loss = float(executor.inference({"input": x, "labels": y}, ["loss"])["loss"])
        executor.train()
        return loss

    return step, loss_of


def _torch_variant(graph, threads: int, compiled: bool):
    import torch
    import torch.nn.functional as F
    from torch_models import GPT  # nanoGPT's module over the graph's weights

    torch.set_num_threads(threads)
    model = GPT(graph, MODEL["heads"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=WEIGHT_DECAY)

    def loss(ids, labels):
        logits = model(ids)
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    forward = torch.compile(loss) if compiled else loss

    def step(x, y) -> float:
        optimizer.zero_grad(set_to_none=True)
        value = forward(torch.from_numpy(x), torch.from_numpy(y))
        value.backward()
        optimizer.step()
        return float(value.detach())

    def loss_of(x, y) -> float:
        with torch.no_grad():
            return float(loss(torch.from_numpy(x), torch.from_numpy(y)))

    return step, loss_of


def run(variant: str, threads: int, target: float, max_steps: int, eval_every: int) -> dict:
    """One training run of ``variant`` until the validation loss reaches ``target``."""
    from meta.common.threads import set_threads
    from meta.lv1.language_models import gpt
    from meta.lv2.sampler import ShuffleSampler

    set_threads(threads)
    train, x_val, y_val, vocab = _data()
    graph = gpt(input_shape=(CONTEXT,), classes=vocab, seed=0, dtype=np.int64, **MODEL)
    if variant == "meta planned":
        step, loss_of = _meta_variant(graph)
    else:
        step, loss_of = _torch_variant(graph, threads, compiled=variant == "torch.compile")
    sampler = ShuffleSampler(len(train), BATCH, seed=0)
    evaluations = [{"step": 0, "train_s": 0.0, "val_loss": loss_of(x_val, y_val)}]
    elapsed, steps, first_loss, first_step_s, reached = 0.0, 0, None, None, None
    epoch = 0
    while reached is None and steps < max_steps:
        sampler.set_epoch(epoch)
        for indices in sampler:
            x, y = train.batch(indices)
            start = time.perf_counter()
            loss = step(x, y)
            took = time.perf_counter() - start
            elapsed += took
            steps += 1
            first_loss = loss if first_loss is None else first_loss
            first_step_s = took if first_step_s is None else first_step_s
            if steps % eval_every == 0:
                val = loss_of(x_val, y_val)
                evaluations.append({"step": steps, "train_s": elapsed, "val_loss": val})
                if val <= target:
                    reached = elapsed
                    break
            if steps >= max_steps:
                break
        epoch += 1
    return {"variant": variant, "threads": threads, "target": target,
            "time_to_target_s": reached, "steps": steps,
            "after_first_step_s": None if reached is None else reached - first_step_s, "first_loss": first_loss,
            "first_step_s": first_step_s, "evaluations": evaluations}


def _plot(results: list[dict], threads: list[int], target: float, path: Path) -> None:
    from meta.bench.plots import _figure, _median_band, _save, _title

    fig = _figure(width=6.4 * len(threads) / 1.4, height=3.6)
    for column, t in enumerate(threads):
        ax = fig.add_subplot(1, len(threads), column + 1)
        for i, variant in enumerate(VARIANTS):
            runs = [r["evaluations"] for r in results
                    if r["variant"] == variant and r["threads"] == t]
            if not runs:
                continue
            times, _, _ = _median_band([[e["train_s"] for e in run] for run in runs])
            values, low, high = _median_band([[e["val_loss"] for e in run] for run in runs])
            ax.plot(times, values, "o-", color=f"C{i}", markersize=3, lw=1.2,
                    label=f"{variant} ({len(runs)} runs)")
            if len(runs) > 1:
                ax.fill_between(times, low, high, color=f"C{i}", alpha=0.2, lw=0)
        ax.axhline(target, color="black", ls="--", lw=0.8, label=f"target {target:g}")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("validation loss (nats/char)")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _title(ax, "Shakespeare GPT: validation loss against training time (median, band: min-max)")
    _save(fig, path)


def _summary(results: list[dict], threads: int) -> list[str]:
    from meta.bench.stats import ratio_of_medians, summarize

    lines, times = [], {}
    for variant in VARIANTS:
        runs = [r for r in results if r["variant"] == variant and r["threads"] == threads]
        reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
        if not runs:
            continue
        if not reached:
            lines.append(f"  {variant:<14} never reached (0 of {len(runs)} runs)")
            continue
        times[variant] = reached
        s = summarize(reached)
        first = np.median([r["first_step_s"] for r in runs])
        later = summarize([r["after_first_step_s"] for r in runs
                           if r["after_first_step_s"] is not None]).median
        lines.append(f"  {variant:<14} {s.median:7.1f} s [{s.ci_low:.1f}, {s.ci_high:.1f}] "
                     f"({len(reached)} of {len(runs)} runs; median steps "
                     f"{int(np.median([r['steps'] for r in runs]))}; first step {first:.2f} s, "
                     f"the rest {later:.1f} s)")
    if "meta planned" in times:
        for other in ("pytorch eager", "torch.compile"):
            if other in times:
                r = ratio_of_medians(times["meta planned"], times[other])
                paired = _paired_ratios(results, threads, other)
                lines.append(f"  {other} / meta planned: {r.ratio:.2f} [{r.ci_low:.2f}, "
                             f"{r.ci_high:.2f}] (above 1: meta reaches the loss sooner); "
                             f"round by round: {', '.join(f'{p:.2f}' for p in paired)}")
    return lines


def _paired_ratios(results: list[dict], threads: int, other: str) -> list[float]:
    """``other``'s time / meta's in each round (the variants of a round ran back to back, so
    a load that changes between rounds cancels out of these, not out of the medians')."""
    rounds: dict[str, list] = {}
    for r in results:
        if r["threads"] == threads:
            rounds.setdefault(r["variant"], []).append(r["time_to_target_s"])
    return [o / m for m, o in zip(rounds.get("meta planned", []), rounds.get(other, []))
            if m and o]


def _write_json(args: argparse.Namespace, env: dict, results: list[dict]) -> None:
    from meta.common.files import write_text

    settings = vars(args) | {"json": str(args.json), "plot": str(args.plot)}
    write_text(args.json, json.dumps({"environment": env, "load_now": os.getloadavg()[0],
                                      "settings": settings, "results": results}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--target", type=float, default=2.3,
                        help="validation loss, nats per character (unigram: about 3.3)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.child[0], int(args.child[1]), args.target, args.max_steps,
                             args.eval_every)))
        return
    from harness import child_run, environment, print_environment

    env = environment()
    print_environment(env)
    variants, threads = args.variants.split(","), [int(t) for t in args.threads.split(",")]
    results = []
    for t in threads:
        for _ in range(args.runs):
            for variant in variants:  # taking turns
                r = child_run(__file__, variant, t, "--target", str(args.target),
                              "--max-steps", str(args.max_steps), "--eval-every",
                              str(args.eval_every))
                results.append(r)
                if args.json:  # after every run: a stopped benchmark keeps what it measured
                    _write_json(args, env, results)
                print(f"{variant:<14} {t} thread(s): {r['time_to_target_s']} s to "
                      f"{args.target} ({r['steps']} steps; first loss {r['first_loss']:.4f}, "
                      f"last validation {r['evaluations'][-1]['val_loss']:.4f}); "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"{t} thread(s): time to validation loss {args.target} (training time, "
              f"evaluations excluded; median [95 % CI])")
        print("\n".join(_summary(results, t)))
    end_load = os.getloadavg()[0]
    print(f"load average: {env['load_average']:.2f} at the start, {end_load:.2f} at the end")
    if args.json:
        _write_json(args, env, results)
    if args.plot:
        _plot(results, threads, args.target, args.plot)


if __name__ == "__main__":
    main()
