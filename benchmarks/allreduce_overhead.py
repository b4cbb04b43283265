"""What meta's communicator adds to an allreduce: framework against raw mpi4py, same bytes.

Run:  mpiexec -n 2 python benchmarks/allreduce_overhead.py [--calls 50 --repeats 40]

For float32 buffers of 4 B to 1 MiB, rank 0 prints the time per call of
  raw        ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)``
  meta       ``world().allreduce(buf)`` (argument checks, then the same call)
  meta nb    ``comm.wait(comm.iallreduce(buf))``, the path strategies use
and whether meta is within 1.10x raw or raw + 3 us. Raw and meta alternate in batches of
``--calls`` calls, so load from other jobs falls on both; each figure is a median over batches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from meta.lv3 import MPICommunicator, world

SIZES = [4, 64, 1024, 16 * 1024, 256 * 1024, 1024 * 1024]


def per_call_s(fn, buf: np.ndarray, calls: int, comm) -> float:
    comm.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn(buf)
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    comm = world()
    if not isinstance(comm, MPICommunicator):
        raise SystemExit("run under mpiexec -n 2 (or more): this compares MPI calls")
    mpi, raw_comm = comm._MPI, comm.comm
    variants = {
        "raw": lambda b: raw_comm.Allreduce(mpi.IN_PLACE, b, mpi.SUM),
        "meta": comm.allreduce,
        "meta nb": lambda b: comm.wait(comm.iallreduce(b)),
    }
    rows, ok_all = [], True
    for nbytes in SIZES:
        buf = np.ones(nbytes // 4, np.float32)
        calls = args.calls if nbytes <= 64 * 1024 else max(5, args.calls // 10)
        samples = {name: [] for name in variants}
        for repeat in range(args.repeats + 2):
            for name, fn in variants.items():
                t = per_call_s(fn, buf, calls, comm)
                if repeat >= 2:
                    samples[name].append(t)
        med = {k: comm.allreduce(np.array([np.median(v)]), op="max")[0] for k, v in samples.items()}
        ok = med["meta"] <= max(1.10 * med["raw"], med["raw"] + 3e-6)
        ok_all &= ok
        rows.append((nbytes, med, ok))
    if comm.is_root:
        print(f"allreduce per call on {comm.size} ranks, float32, median of {args.repeats} batches")
        print(f"{'bytes':>9} {'raw us':>10} {'meta us':>10} {'meta/raw':>9} {'meta nb us':>11}  "
              "within 1.10x or +3us")
        for nbytes, med, ok in rows:
            print(f"{nbytes:>9} {med['raw'] * 1e6:>10.2f} {med['meta'] * 1e6:>10.2f} "
                  f"{med['meta'] / med['raw']:>9.3f} {med['meta nb'] * 1e6:>11.2f}  "
                  f"{'yes' if ok else 'NO'}")
        print("overhead: PASS" if ok_all else "overhead: FAIL")


if __name__ == "__main__":
    main()
