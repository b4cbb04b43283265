"""How layer-wise pre-training (a deep belief network's RBMs) runs under a strategy.

Each strategy says it in ``Strategy.pretraining``: "average" (synchronous: each rank a shard
of every batch, the contrastive-divergence statistics averaged by allreduce), "exchange"
(seed 000's asynchronous scheme: each worker its own shard, every CD step pushed through the
strategy's servers, a one-sided window under ``async_rma``) or "replicate" (every rank
pre-trains the same stack from the same seed, without communicating). Level 2 sees only the
hooks (``average``, ``connect``), never MPI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from meta.common import threads as _threads
from meta.common.component import Component
from meta.lv2.optimizers import Optimizer, scale
from meta.lv3.comm.communicator import Communicator
from meta.lv3.strategy import Strategy


@dataclass
class PretrainingPlan:
    shard: tuple[int, int]
    """(this rank's shard, shards)"""
    average: Callable[[np.ndarray], np.ndarray] | None
    """Averages a layer's statistics over the ranks (synchronous strategies), or None."""
    connect: Callable[[dict], Strategy] | None
    """Builds the strategy that trains a layer through the run's servers (asynchronous ones), or
    None."""
    description: str
    """for the log; "" when nothing is distributed"""


def mean_over_ranks(comm: Communicator) -> Callable[[np.ndarray], np.ndarray]:
    """A buffer's mean over ``comm``, as a new array. With more ranks than cores it waits on a
    nonblocking allreduce instead of MPICH's blocking one, which spins against descheduled
    peers (see ``Strategy.average``)."""
    oversubscribed = _threads.local_ranks() > _threads.cores()

    def average(buf: np.ndarray) -> np.ndarray:
        out = np.array(buf)  # a contiguous copy: the caller's buffer is left alone
        if oversubscribed:
            comm.wait(comm.iallreduce(out))
        else:
            comm.allreduce(out)
        out *= 1.0 / comm.size
        return out

    return average


def plan(strategy: Component, options: dict[str, Any], comm: Communicator) -> PretrainingPlan:
    """The pre-training arrangement for ``strategy`` (with its recipe ``options``) on ``comm``."""
    cls = strategy.meta["cls"]
    mode = cls.pretraining if comm.size > 1 else "replicate"
    if mode == "average":
        return PretrainingPlan((comm.rank, comm.size), mean_over_ranks(comm), None,
                               f"data-parallel on {comm.size} ranks (CD statistics averaged "
                               f"by allreduce)")
    if mode == "exchange":
        shard = cls.replica(comm.rank, comm.size, **options)

        def connect(params: dict[str, np.ndarray]) -> Strategy:
            # The RBM's own CD rule made the step: the server adds it as it is.
            return strategy.build(Optimizer(scale(1.0), params), comm, None, **options)

        return PretrainingPlan(shard, None, connect,
                               f"asynchronously ({strategy.name}): {shard[1]} workers on their "
                               f"own data shards, {comm.size - shard[1]} server(s)")
    return PretrainingPlan((0, 1), None, None, "")
