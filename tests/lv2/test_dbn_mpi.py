"""Data-parallel RBM/DBN pre-training, written once (mpi4py's test style, as ``tests/lv3``):
each check takes a Communicator; pytest runs them in-process at size 1, and this file runs as a
script on every rank under ``mpiexec -n 2`` and ``-n 3``:

    mpiexec -n 3 python tests/lv2/test_dbn_mpi.py

Synchronous (allreduce) ranks must end bit-identical and equal to one process trained at the
combined batch. Asynchronous ones (workers on their own shards, a parameter server) must end with
the server's weights on every rank and a reconstruction error as low as one process reaches.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.lv2 import ArrayDataset
from meta.lv2.dbn import pretrain_dbn
from meta.lv2.rbm import RBM
from meta.lv3 import Communicator, SingleProcessCommunicator, replica, world
from meta.lv3.pretraining import mean_over_ranks, plan
from meta.lv3.strategies import STRATEGIES
from tests.checks import run_checks

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


def _prototypes(n: int = 600, seed: int = 0) -> ArrayDataset:
    """Binary 6x6 images: one of four random prototypes with 5 % of the pixels flipped."""
    rng = np.random.default_rng(seed)
    protos = np.random.default_rng(99).random((4, 1, 6, 6)) < 0.5
    y = rng.integers(0, 4, n)
    x = protos[y] ^ (rng.random((n, 1, 6, 6)) < 0.05)
    return ArrayDataset(x.astype(np.float32), y.astype(np.int64))


def _async_pretraining(comm: Communicator, strategy: str) -> None:
    data = _prototypes()
    options = {"layers": (16, 8), "epochs": 3, "lr": 0.1, "momentum": 0.5, "batch_size": 10,
               "seed": 3}
    index, workers = replica(strategy, comm.rank, comm.size)
    arrangement = plan(STRATEGIES[strategy], STRATEGIES[strategy].resolve({}), comm)
    assert arrangement.shard == ((index, workers) if comm.size > 1 else (0, 1))
    dbn = pretrain_dbn(data, replica=(index, workers), connect=arrangement.connect, **options)
    alone = pretrain_dbn(data, **options)  # one process on all the data
    weights = [a for rbm in dbn.rbms for a in (rbm.W, rbm.b, rbm.c)]
    _assert_identical_across_ranks(comm, weights)  # the server's, on every rank
    assert [m["layer"] for m in dbn.history][-1] == 2
    x = data.inputs.reshape(len(data), -1)
    untrained = pretrain_dbn(data, **{**options, "epochs": 0})
    for layer, (mine, theirs, start) in enumerate(zip(dbn.rbms, alone.rbms, untrained.rbms)):
        v = dbn.transform(x, layer) if layer else x  # what each layer learned on
        ours, reference, before = (r.reconstruction_error(v) for r in (mine, theirs, start))
        # Within a tenth of one process's drop of it (staleness makes the top layer, whose
        # errors are small, vary: 0.003 to 0.022 against 0.005, from 0.23, in trial runs).
        assert ours < reference + 0.1 * (before - reference), \
            f"{strategy} layer {layer + 1}: {before} -> {ours}, one process {reference}"
    if comm.size == 1:  # no server: the rank trains locally, as pretrain_dbn alone does
        for mine, theirs in zip(dbn.rbms, alone.rbms):
            for name in ("W", "b", "c"):
                np.testing.assert_array_equal(mine.params[name], theirs.params[name])
    if index == 0 and comm.rank != comm.size - 1:  # a worker: its own shard's error falls
        errors = [m["reconstruction_error"] for m in dbn.history if m["layer"] == 1]
        assert len(errors) == 3 and errors[-1] < errors[0], errors


def check_async_rma_pretraining(comm: Communicator) -> None:
    _async_pretraining(comm, "async_rma")


def check_async_parameter_server_pretraining(comm: Communicator) -> None:
    _async_pretraining(comm, "async_parameter_server")


def check_downpour_pretraining(comm: Communicator) -> None:
    _async_pretraining(comm, "downpour")


CHECKS: dict[str, Callable[[Communicator], None]] = {
    check.__name__: check
    for check in (check_dbn_pretraining_matches_combined_batch,
                  check_gaussian_pcd_matches_combined_batch,
                  check_async_rma_pretraining,
                  check_async_parameter_server_pretraining,
                  check_downpour_pretraining)
}


def main() -> int:
    comm = world()
    return run_checks(comm, CHECKS, CHECKS, barrier_after=lambda name: False,
                      suffix=f" on {type(comm).__name__}")



@pytest.mark.parametrize("name", list(CHECKS))
def test_check_at_size_one(name: str) -> None:
    CHECKS[name](SingleProcessCommunicator())


def test_every_parameter_server_strategy_is_checked() -> None:
    exchanging = [name for name in STRATEGIES
                  if STRATEGIES[name].meta["cls"].pretraining == "exchange"]
    assert exchanging == ["async_parameter_server", "async_rma", "downpour"]
    assert {f"check_{name}_pretraining" for name in exchanging} <= set(CHECKS)


def test_average_and_connect_exclude_each_other() -> None:
    comm = SingleProcessCommunicator()
    with pytest.raises(ValueError, match="average .* or connect .* not both"):
        pretrain_dbn(_binary_data(), (4,), batch_size=PER_RANK, average=mean_over_ranks(comm),
                     connect=lambda params: None)


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_checks_under_mpiexec(mpirun: Callable[..., str], ranks: int) -> None:
    out = mpirun(ranks, [sys.executable, str(Path(__file__))])
    for rank in range(ranks):
        assert f"rank {rank}/{ranks}: {len(CHECKS)} checks passed on MPICommunicator" in out, out


if __name__ == "__main__":
    sys.exit(main())
