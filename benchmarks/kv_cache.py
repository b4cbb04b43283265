"""Generating text with a key/value cache against recomputing the window for every token.

Run:  python benchmarks/kv_cache.py [--tokens 256 --context 256 --model RUN/model.onnx]

The model is the shakespeare_gpt recipe's GPT (2 layers, 4 heads, width 128, 65 characters) with
a context of ``--context`` positions (default 256, so 256 new tokens after a one-token prompt
stay within it), its weights as initialised (the time does not depend on their values), or a
trained ``--model``. It generates ``--tokens`` tokens at temperature 0 three ways, once each
(one run, as the acceptance asks): recomputing with the reference executor (``generate``'s
default, what ``meta sample --no-cache`` does), recomputing with the planned executor, and with
the cache (``generate(cache=True)``, on one BLAS thread); prints each time, the ratios, whether the tokens are
equal, and the CPU. Past the context the window slides and the cache recomputes too
(``meta.lv2.kv_cache``): ``--context 64`` shows what is left of the gain then.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from meta.lv1 import ReferenceExecutor, from_onnx, gpt
from meta.lv2.generate import generate


def cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        name = platform.processor() or "unknown CPU"
    return f"{name}, {os.cpu_count()} cores visible, load {os.getloadavg()[0]:.1f}"


def timed(executor, tokens: int, cache: bool) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    ids = generate(executor, [0], tokens, temperature=0.0, rng=np.random.default_rng(0),
                   cache=cache)
    return time.perf_counter() - start, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--model", help="a trained GPT's model.onnx (default: initialised)")
    parser.add_argument("--threads", type=int, default=0, help="BLAS threads for all three "
                        "(default 0: as the process starts; the cache always uses one)")
    args = parser.parse_args()
    if args.threads:
        from meta.common.threads import set_threads

        set_threads(args.threads)
    graph = from_onnx(args.model) if args.model else \
        gpt((args.context,), classes=65, layers=2, heads=4, width=128, seed=0)
    from meta.lv1.plan import PlannedExecutor

    print(f"CPU: {cpu()}; BLAS threads for recomputing: {args.threads or 'default'}")
    print(f"model: {graph.initializers['wpe'].shape[0]} positions, "
          f"{sum(v.size for v in graph.parameters.values()):,} parameters; "
          f"{args.tokens} tokens at temperature 0 after a 1-token prompt")
    reference_s, expected = timed(ReferenceExecutor(graph), args.tokens, cache=False)
    planned = PlannedExecutor(graph)
    timed(planned, 1, cache=False)  # its plan is built on the first call: not generation
    planned_s, planned_ids = timed(planned, args.tokens, cache=False)
    cached_s, cached = timed(ReferenceExecutor(graph), args.tokens, cache=True)
    per = 1000 / args.tokens
    print(f"recompute, reference executor  {reference_s:8.3f} s  {reference_s * per:7.2f} ms/token")
    print(f"recompute, planned executor    {planned_s:8.3f} s  {planned_s * per:7.2f} ms/token")
    print(f"key/value cache                {cached_s:8.3f} s  {cached_s * per:7.2f} ms/token")
    print(f"speed-up: {reference_s / cached_s:.1f}x over the reference executor, "
          f"{planned_s / cached_s:.1f}x over the planned executor")
    same = np.array_equal(expected, cached)
    print(f"tokens equal to recomputing (reference): {same}; planned executor's equal to the "
          f"reference's: {np.array_equal(expected, planned_ids)}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
