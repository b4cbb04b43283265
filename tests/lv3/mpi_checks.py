"""MPI checks written once (mpi4py's test style): each takes a Communicator and asserts.

pytest runs them in-process at size 1; under MPI they run as a script, on every rank:

    mpiexec -n 4 python tests/lv3/mpi_checks.py [check_name ...]

A failing rank prints its traceback and aborts the whole job, so no other rank waits forever.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv2.sampler import ShuffleSampler
from meta.lv3 import (
    AllreduceOptimizer,
    Communicator,
    DistributedSampler,
    FlatBuffer,
    MPICommunicator,
    allreduce_mean,
    world,
)


def check_allreduce(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    buf = np.arange(6, dtype=np.float64).reshape(2, 3) + r
    assert comm.allreduce(buf) is buf
    np.testing.assert_array_equal(buf, p * np.arange(6).reshape(2, 3) + p * (p - 1) / 2)
    for op, expected in (("max", p - 1), ("min", 0)):
        buf = np.full(3, r, dtype=np.float32)
        comm.allreduce(buf, op=op)
        np.testing.assert_array_equal(buf, np.full(3, expected, dtype=np.float32))
    ints = np.array([r, 1], dtype=np.int64)
    np.testing.assert_array_equal(comm.allreduce(ints), [p * (p - 1) // 2, p])
    np.testing.assert_array_equal(allreduce_mean(comm, float(r)), (p - 1) / 2)


def check_bcast(comm: Communicator) -> None:
    root = comm.size - 1
    buf = np.full((2, 2), comm.rank, dtype=np.float64)
    assert comm.bcast(buf, root=root) is buf
    np.testing.assert_array_equal(buf, np.full((2, 2), root))
    assert comm.bcast_obj({"epoch": comm.rank}, root=0) == {"epoch": 0}


def check_allgather(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    out = comm.allgather(np.array([r, 10 * r], dtype=np.float32))
    assert out.shape == (p, 2) and out.dtype == np.float32
    np.testing.assert_array_equal(out, [[q, 10 * q] for q in range(p)])
    gathered = comm.gather_obj(r, root=0)
    assert gathered == (list(range(p)) if comm.is_root else None)
    assert comm.allreduce_obj(r + 1) == p * (p + 1) // 2
    assert comm.allreduce_obj(r, op="max") == p - 1
    comm.barrier()


def check_noncontiguous_rejected(comm: Communicator) -> None:
    # Every rank fails before entering MPI, so nobody is left waiting in the collective.
    strided = np.zeros((4, 4))[:, ::2]
    for call in (comm.allreduce, comm.bcast, comm.allgather):
        try:
            call(strided)
        except ValueError as err:
            assert "(4, 2)" in str(err) and "float64" in str(err), err
        else:
            raise AssertionError(f"{call.__name__} accepted a non-contiguous array")


def check_thread_level(comm: Communicator) -> None:
    if isinstance(comm, MPICommunicator):  # asked for before MPI_Init: no locking per call
        assert comm._MPI.Query_thread() == comm._MPI.THREAD_SINGLE, comm._MPI.Query_thread()


def check_distributed_sampler(comm: Communicator) -> None:
    n, batch, p = 23, 3, comm.size
    sampler = DistributedSampler(n, batch, rank=comm.rank, size=p, seed=5)
    sampler.set_epoch(2)
    shard = np.concatenate(list(sampler))
    np.testing.assert_array_equal(shard, sampler.indices())
    shards = comm.allgather(shard)  # same length on every rank, or Allgather would fail
    padded = -(-n // p) * p
    assert shards.size == padded
    assert set(shards.ravel().tolist()) == set(range(n))
    counts = comm.allgather(np.array([len(sampler), sum(1 for _ in sampler)]))
    assert (counts == counts[0]).all() and counts[0, 0] == counts[0, 1], counts


def _problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.normal(size=(96, 5))
    y = x @ rng.normal(size=(5, 2)) + 0.5 + 0.01 * rng.normal(size=(96, 2))
    return x, y


def _init(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": 0.1 * rng.normal(size=(5, 2)), "b": rng.normal(size=2)}


def _grads(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradient of the mean of 0.5 * |x w + b - y|^2 over the batch."""
    residual = x @ params["w"] + params["b"] - y
    return {"w": x.T @ residual / len(x), "b": residual.mean(axis=0)}


def _loss(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(0.5 * np.mean(np.sum((x @ params["w"] + params["b"] - y) ** 2, axis=1)))


def check_broadcast_on_construction(comm: Communicator) -> None:
    params = _init(seed=100 + comm.rank)
    arrays = dict(params)
    opt = AllreduceOptimizer(Optimizer(sgd(0.1), params), comm)
    assert opt.params is params and all(params[k] is arrays[k] for k in arrays)  # in place
    expected = _init(seed=100)
    for name in expected:
        np.testing.assert_array_equal(params[name], expected[name])


def check_allreduce_sgd_matches_single_process(comm: Communicator) -> None:
    x, y = _problem()
    per_rank, epochs, p = 4, 2, comm.size
    opt = AllreduceOptimizer(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm)
    sampler = DistributedSampler(len(x), per_rank, rank=comm.rank, size=p, seed=7)
    reference = Optimizer(sgd(0.1), _init(seed=100))  # one process at batch p * per_rank
    ref_sampler = ShuffleSampler(len(x), p * per_rank, seed=7)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ref_sampler.set_epoch(epoch)
        assert len(sampler) == len(ref_sampler)
        for idx, ref_idx in zip(sampler, ref_sampler):
            opt.step(_grads(opt.params, x[idx], y[idx]))
            reference.step(_grads(reference.params, x[ref_idx], y[ref_idx]))
    assert _loss(opt.params, x, y) < 0.1 * _loss(_init(seed=100), x, y)
    flat = FlatBuffer.like(opt.params)
    everyone = comm.allgather(flat.pack(opt.params))
    assert all(np.array_equal(row, everyone[0]) for row in everyone), "ranks diverged"
    for name, value in reference.params.items():
        np.testing.assert_allclose(opt.params[name], value, rtol=1e-6, atol=1e-12)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_allreduce,
        check_bcast,
        check_allgather,
        check_noncontiguous_rejected,
        check_thread_level,
        check_distributed_sampler,
        check_broadcast_on_construction,
        check_allreduce_sgd_matches_single_process,
    )
}


def main(argv: list[str]) -> int:
    """Run the named checks (all by default) on ``world()``, or MPI's world with ``--mpi``."""
    use_mpi = "--mpi" in argv
    names = [a for a in argv if a != "--mpi"] or list(CHECKS)
    comm = MPICommunicator() if use_mpi else world()
    tag = f"rank {comm.rank}/{comm.size}"
    for name in names:
        try:
            CHECKS[name](comm)
        except BaseException:
            traceback.print_exc()
            print(f"{tag}: FAILED {name} on {comm!r}", flush=True)
            sys.stderr.flush()
            if isinstance(comm, MPICommunicator):
                comm.comm.Abort(1)
            return 1
        comm.barrier()
    print(f"{tag}: {len(names)} checks passed on {type(comm).__name__}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
