"""Tensor fusion: one allreduce of a flat buffer against one allreduce per tensor.

Run:  mpiexec -n 2 python benchmarks/fusion.py [--tensors 200 --bytes 1024 --repeats 30]

Both average 200 float32 gradients of 1 KiB over the ranks. "per tensor" calls
``comm.allreduce`` on each and scales it; "fused" is what ``Allreduce.step`` does before the
update: pack them into the persistent ``FlatBuffer``, one ``Iallreduce`` per chunk (here one),
scale the buffer, whose views are the averaged gradients. Rank 0 prints the time per step of
each (median over interleaved repeats) and the speed-up; the target is >= 1.5x.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import Allreduce, world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    comm = world()
    rng = np.random.default_rng(comm.rank)
    shape = (args.bytes // 4,)
    grads = {f"g{i}": rng.normal(size=shape).astype(np.float32) for i in range(args.tensors)}
    strategy = Allreduce(Optimizer(sgd(0.1), {k: np.zeros_like(v) for k, v in grads.items()}),
                         comm)
    scale = np.float32(1.0 / comm.size)

    def per_tensor() -> None:
        for g in grads.values():
            comm.allreduce(g)
            g *= scale

    def fused() -> None:
        buffer = strategy.flat_grads.pack(grads)
        strategy.average(strategy.grad_chunks, buffer)

    samples: dict[str, list[float]] = {"per tensor": [], "fused": []}
    for repeat in range(args.repeats + 2):
        for name, fn in (("per tensor", per_tensor), ("fused", fused)):
            comm.barrier()
            start = time.perf_counter()
            fn()
            elapsed = comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]
            if repeat >= 2:
                samples[name].append(elapsed)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    if comm.is_root:
        speedup = med["per tensor"] / med["fused"]
        print(f"{args.tensors} tensors of {args.bytes} B on {comm.size} ranks "
              f"(median of {args.repeats})")
        print(f"per tensor: {med['per tensor'] * 1e3:8.3f} ms per step")
        print(f"fused:      {med['fused'] * 1e3:8.3f} ms per step")
        print(f"speed-up:   {speedup:8.1f}x  ({'PASS' if speedup >= 1.5 else 'FAIL'}: >= 1.5x)")


if __name__ == "__main__":
    main()
