"""Data-parallel RBM/DBN pre-training, written once (mpi4py's test style, as ``tests/lv3``):
each check takes a Communicator; pytest runs them in-process at size 1, and this file runs as a
script on every rank under ``mpiexec -n 2``:

    mpiexec -n 2 python tests/lv2/test_dbn_mpi.py

Ranks must end bit-identical and equal to one process trained at the combined batch.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.lv2 import ArrayDataset
from meta.lv2.dbn import pretrain_dbn
from meta.lv2.rbm import RBM
from meta.lv3 import Communicator, MPICommunicator, SingleProcessCommunicator, world
from meta.runner import mean_over_ranks

PER_RANK = 8  # rows per rank per update; 96 examples fill whole global batches at 1 to 4 ranks


def _binary_data(n: int = 96, shape: tuple[int, ...] = (1, 3, 4)) -> ArrayDataset:
    rng = np.random.default_rng(7)
    x = (rng.random((n, *shape)) < 0.3).astype(np.float32)
    return ArrayDataset(x, np.zeros(n, np.int64))


def _assert_identical_across_ranks(comm: Communicator, arrays: list[np.ndarray]) -> None:
    flat = np.concatenate([a.ravel() for a in arrays]).astype(np.float32)
    everyone = comm.allgather(flat)
    assert all(np.array_equal(row, everyone[0]) for row in everyone), "ranks diverged"


def check_dbn_pretraining_matches_combined_batch(comm: Communicator) -> None:
    data, p = _binary_data(), comm.size
    options = {"layers": (6, 4), "epochs": 2, "lr": 0.1, "momentum": 0.5, "seed": 3}
    dbn = pretrain_dbn(data, batch_size=PER_RANK, replica=(comm.rank, p),
                       average=mean_over_ranks(comm), **options)
    alone = pretrain_dbn(data, batch_size=p * PER_RANK, **options)  # one process, batch p * 8
    weights = [a for rbm in dbn.rbms for a in (rbm.W, rbm.b, rbm.c)]
    _assert_identical_across_ranks(comm, weights)
    assert [r.updates for r in dbn.rbms] == [r.updates for r in alone.rbms] == [2 * 12 // p] * 2
    for mine, theirs in zip(dbn.rbms, alone.rbms):
        for name in ("W", "b", "c"):
            np.testing.assert_allclose(mine.params[name], theirs.params[name], atol=1e-5,
                                       err_msg=f"{name} of the {mine!r} at {p} ranks")
    np.testing.assert_allclose([m["reconstruction_error"] for m in dbn.history],
                               [m["reconstruction_error"] for m in alone.history], rtol=1e-5)


def check_gaussian_pcd_matches_combined_batch(comm: Communicator) -> None:
    """Gaussian noise and persistent chains split by rows too (every draw goes through
    ``rbm.draw``)."""
    p, rank = comm.size, comm.rank
    x = np.random.default_rng(1).standard_normal((4 * p * PER_RANK, 5)).astype(np.float32)
    options = {"visible": "gaussian", "sample_visible": True, "persistent": True, "k": 2,
               "lr": 0.01, "momentum": 0.5, "weight_decay": 1e-3}
    mine = RBM(5, 3, rng=11, replica=(rank, p), **options)
    alone = RBM(5, 3, rng=11, **options)
    average = mean_over_ranks(comm)
    for batch in np.split(x, 4):
        mine.cd_update(batch[rank::p], average)
        alone.cd_update(batch)
    _assert_identical_across_ranks(comm, [mine.W, mine.b, mine.c])
    for name, value in alone.params.items():
        np.testing.assert_allclose(mine.params[name], value, atol=1e-5, err_msg=name)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    check.__name__: check
    for check in (check_dbn_pretraining_matches_combined_batch,
                  check_gaussian_pcd_matches_combined_batch)
}


def main() -> int:
    comm = world()
    tag = f"rank {comm.rank}/{comm.size}"
    for name, check in CHECKS.items():
        try:
            check(comm)
        except BaseException:
            traceback.print_exc()
            print(f"{tag}: FAILED {name}", flush=True)
            if isinstance(comm, MPICommunicator):
                comm.abort(1)  # no other rank waits forever in a collective
            return 1
    print(f"{tag}: {len(CHECKS)} checks passed on {type(comm).__name__}", flush=True)
    return 0



@pytest.mark.parametrize("name", list(CHECKS))
def test_check_at_size_one(name: str) -> None:
    CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
def test_checks_under_mpiexec(mpirun: Callable[..., str]) -> None:
    out = mpirun(2, [sys.executable, str(Path(__file__))])
    for rank in range(2):
        assert f"rank {rank}/2: {len(CHECKS)} checks passed on MPICommunicator" in out, out


if __name__ == "__main__":
    sys.exit(main())
