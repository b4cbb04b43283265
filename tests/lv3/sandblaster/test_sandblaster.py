"""Sandblaster L-BFGS: the checks of ``sandblaster_checks.py`` in-process at size 1 and under
``mpiexec -n 3`` / ``-n 4``, and the vector-command protocol of the shards at size 1."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv2.second_order import LBFGS, two_loop
from meta.lv3 import SingleProcessCommunicator, make_strategy, replica
from meta.lv3.sandblaster.portions import PortionStats
from meta.lv3.sandblaster.shards import (
    AXPY,
    COPY,
    DOT,
    NORMS,
    SCALE,
    SUB,
    X_SLOT,
    ShardVectors,
    VectorShard,
)
from meta.lv3.sandblaster.strategy import Sandblaster

from . import sandblaster_checks

SCRIPT = str(Path(sandblaster_checks.__file__))


@pytest.mark.parametrize("name", list(sandblaster_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    sandblaster_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [3, 4])  # 2 workers; at 4 also a shard on its own rank
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=300)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(sandblaster_checks.CHECKS)} checks passed" in out, out
    assert "ratio 1.0000" in out, out  # the loss agrees with single-process L-BFGS


def _vectors(x0: np.ndarray) -> tuple[VectorShard, ShardVectors]:
    comm = SingleProcessCommunicator()
    shard = VectorShard(comm, (0, len(x0)), x0, workers=[])
    return shard, ShardVectors(comm, shard, [], [(0, len(x0))], lambda: False)


def test_vector_commands_on_one_shard() -> None:
    shard, ops = _vectors(np.array([1.0, -2.0, 3.0]))
    y = ops.copy(X_SLOT)
    ops.axpy(2.0, X_SLOT, y)  # y = 3 x
    ops.scale(0.5, y)  # y = 1.5 x
    z = ops.alloc()
    ops.command(SUB, y, X_SLOT, z)  # z = 0.5 x
    assert ops.dots([(X_SLOT, z), (y, y)]) == [7.0, 31.5]
    assert ops.norms(z) == (1.5, 3.0)
    np.testing.assert_array_equal(shard.slot(y), [1.5, -3.0, 4.5])
    assert ops.round_trips == 2  # commands wait for the next answer needed
    answers = shard.execute(np.array([[COPY, y, 9, 0, 0], [AXPY, y, 9, 0, -1.0],
                                      [SCALE, 9, 0, 0, 3.0], [DOT, 9, 9, 0, 0],
                                      [NORMS, y, 0, 0, 0]], dtype=float))
    assert answers == [0.0, 4.5, 9.0]
    out = np.empty(3)
    ops.gather(z, out)
    np.testing.assert_array_equal(out, [0.5, -1.0, 1.5])


def test_two_loop_through_the_shards_equals_numpy() -> None:
    rng = np.random.default_rng(3)
    n, m = 12, 4
    g = rng.normal(size=n)
    pairs = [(rng.normal(size=n), rng.normal(size=n)) for _ in range(m)]
    pairs = [(s, y + 3 * s) for s, y in pairs]  # s.y > 0
    expected = two_loop(g, pairs)
    shard, ops = _vectors(g)
    slots = []
    for s, y in pairs:
        a, b = ops.alloc(), ops.alloc()
        shard.slot(a)[:], shard.slot(b)[:] = s, y
        slots.append((a, b))
    d = two_loop(X_SLOT, slots, ops)
    ops.flush()  # the last axpy and the sign change wait for the next message otherwise
    np.testing.assert_allclose(shard.slot(d), expected, rtol=1e-12)
    assert ops.round_trips == 1 + 2 * m  # the fixed products in one, then two per pair


def test_portion_stats_report() -> None:
    stats = PortionStats(2)
    stats.completed[:] = (10, 6)
    stats.discarded[:] = (1, 0)
    stats.backups_issued, stats.backups_won = 1, 1
    stats.batch_times = [0.02, 0.04, 0.03]
    metrics = stats.metrics()
    assert metrics["portions_worker_0"] == 10 and metrics["batch_time_median_s"] == 0.03
    assert "worker 1: 6 / 0" in stats.format() and "backups issued 1, won 1" in stats.format()


def test_options_are_checked_by_name() -> None:
    params = {"w": np.zeros(2)}
    for key, value in (("servers", 0), ("portions", 0), ("backups", -1), ("portions", 1.5)):
        with pytest.raises(ValueError, match=key):
            Sandblaster(LBFGS(params), **{key: value})
    with pytest.raises(ValueError, match="slowdown"):
        Sandblaster(LBFGS(params), slowdown=0.5)
    with pytest.raises(TypeError, match="optimizer to 'lbfgs'"):
        Sandblaster(Optimizer(sgd(0.1), params))
    with pytest.raises(TypeError, match="step_rows"):
        Sandblaster(LBFGS(params)).step({"w": np.ones(2)})
    with pytest.raises(ValueError, match="no rows evaluator"):
        Sandblaster(LBFGS(params)).step_rows(np.arange(2))


def test_every_rank_holds_the_whole_data() -> None:
    assert [replica("sandblaster", r, 4) for r in range(4)] == [(0, 1)] * 4
    opt = make_strategy("sandblaster", LBFGS({"w": np.zeros(2)}), portions=4, servers=2)
    assert (opt.name, opt.portions, opt.part, opt.role) == ("sandblaster", 4, "coordinator",
                                                           "worker")


@pytest.mark.mpi
@pytest.mark.slow
def test_more_portions_than_rows_under_mpiexec(mpirun: Callable[..., str]) -> None:
    out = mpirun(3, [sys.executable, SCRIPT, "more_portions_than_rows"], timeout=120)
    assert "5 rows in 16 portions" in out and "nan" not in out, out
    for rank in range(3):
        assert f"rank {rank}/3: 1 checks passed" in out, out
