"""Chunk size of the fused allreduce: time one step's gradient exchange per chunk size.

Run:  mpiexec -n 2 python benchmarks/chunk_sweep.py [--repeats 20]
      mpiexec -n 4 python benchmarks/chunk_sweep.py

For the gradients of two MLPs (784-256-128-10: 0.94 MB, 784-512-512-10: 2.68 MB, float32) it
times the exchange exactly as ``Strategy.average`` does it: one ``Iallreduce`` per chunk, then
``Waitall`` (a single blocking ``Allreduce`` when there is one chunk), median of the repeats.
Rank 0 prints one row per chunk size, and the best.

Measured on the 2-core dev machine (MPICH 4 over shared memory, other jobs running, so expect
noise; -n 4 is oversubscribed), ms per exchange:

    chunk          -n 2: 0.94 MB  2.68 MB    -n 4: 0.94 MB  2.68 MB
    64 KiB               2.91     3.79            13.3     20.1
    256 KiB              0.24     1.11            16.0     19.4
    1 MiB                0.20     0.69            16.0     18.2
    4 MiB                0.17     0.64            10.8     17.5
    whole                0.14     0.85            16.0     16.0
    blocking (whole)     0.29     0.74          1557      4500

Small chunks only add per-message latency: MPICH progresses a nonblocking collective inside MPI
calls only, so chunks overlap nothing here. The default, ``DEFAULT_CHUNK_BYTES = 4 MiB``, was
best or within noise of the best in every column, keeps these MLPs in one message and bounds a
message for larger networks. The blocking row is why ``Strategy.average`` uses Iallreduce +
Wait when ranks outnumber cores: MPICH's blocking Allreduce spins against descheduled peers.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from meta.lv3 import FlatBuffer, world

MODELS = {"mlp 784-256-128-10": [784 * 256 + 256, 256 * 128 + 128, 128 * 10 + 10],
          "mlp 784-512-512-10": [784 * 512 + 512, 512 * 512 + 512, 512 * 10 + 10]}
BLOCKING = 0  # for comparison: one blocking Allreduce of the whole buffer
CHUNKS = [64 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024, 1 << 40, BLOCKING]
LABELS = {1 << 40: "whole", BLOCKING: "blocking"}


def exchange_s(comm, flat: FlatBuffer, chunk_bytes: int) -> float:
    comm.barrier()
    start = time.perf_counter()
    if chunk_bytes == BLOCKING:
        comm.allreduce(flat.buffer)
    else:  # as Strategy.average does it
        comm.waitall([comm.iallreduce(chunk) for chunk in flat.chunks(chunk_bytes)])
    return comm.allreduce(np.array([time.perf_counter() - start]), op="max")[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    comm = world()
    flats = {m: FlatBuffer({f"t{i}": (n,) for i, n in enumerate(sizes)}, np.float32)
             for m, sizes in MODELS.items()}
    configs = [(m, c) for m in MODELS for c in CHUNKS]
    samples: dict[tuple[str, int], list[float]] = {k: [] for k in configs}
    for repeat in range(args.repeats + 2):  # interleaved, so that load from other jobs is shared
        for model, chunk in configs:
            t = exchange_s(comm, flats[model], chunk)
            if repeat >= 2:
                samples[model, chunk].append(t)
    results = {k: float(np.median(v)) for k, v in samples.items()}
    if comm.is_root:
        print(f"chunk sweep on {comm.size} ranks (median of {args.repeats}, ms)")
        print(f"{'chunk':>12} " + " ".join(f"{m:>20}" for m in MODELS))
        for chunk in CHUNKS:
            label = LABELS.get(chunk, f"{chunk // 1024} KiB")
            print(f"{label:>12} " + " ".join(f"{results[m, chunk] * 1e3:>20.3f}" for m in MODELS))
        for model in MODELS:
            best = min(CHUNKS, key=lambda c: results[model, c])
            print(f"best for {model}: {LABELS.get(best, f'{best} bytes')}")


if __name__ == "__main__":
    main()
