"""Peak memory of one training step of the 784-512-512-10 MLP at batch 512, micro-batched.

For k = 1, 2, 4, 8 micro-batches: the tracemalloc peak of ``inference_and_backprop`` (numpy
reports its buffers to tracemalloc), its ratio to k = 1 measured in the same run, and the
largest absolute gradient difference from k = 1 (float32, so ~1e-7 relative is rounding).
At batch 512 the parameter gradients (2.7 MB) outweigh the activations, so micro-batching,
which keeps an accumulator beside each slice's gradients, cannot lower the peak;
``--batch 8192`` shows where it starts to pay.

    .venv/bin/python benchmarks/microbatch_memory.py
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np

from meta.lv1 import ReferenceExecutor, mlp

BATCH = 512


def step(executor: ReferenceExecutor, feeds: dict, k: int) -> tuple[int, float, dict]:
    gc.collect()
    tracemalloc.start()
    start = time.perf_counter()
    _, grads = executor.inference_and_backprop(feeds, micro_batches=k)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, seconds, grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=BATCH)
    batch = parser.parse_args().batch
    graph = mlp(hidden=(512, 512), seed=0)
    executor = ReferenceExecutor(graph)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((batch, 1, 28, 28)).astype(np.float32),
             "labels": rng.integers(0, 10, batch)}
    executor.inference_and_backprop(feeds)  # warm up (BLAS buffers, imports)
    print(f"MLP 784-512-512-10, batch {batch}, float32, one training step (forward + backward)")
    print(f"{'k':>3} {'peak MiB':>9} {'vs k=1':>7} {'time ms':>8} {'max |grad - grad(k=1)|':>23}")
    base_peak, _, base = step(executor, feeds, 1)
    for k in (1, 2, 4, 8):
        peak, seconds, grads = step(executor, feeds, k)
        diff = max(float(np.abs(grads[n] - base[n]).max()) for n in base)
        print(f"{k:>3} {peak / 2**20:>9.2f} {peak / base_peak:>7.2f} {seconds * 1e3:>8.1f} "
              f"{diff:>23.2e}")


if __name__ == "__main__":
    main()
