"""Strategies by name, as recipes select them (``distributed: ...``).

>>> from meta.lv2.optimizers import Optimizer, sgd
>>> make_strategy("model_averaging", Optimizer(sgd(0.1), {"w": np.zeros(2)}), average_every=4)
ModelAveraging(1 tensors, 16 bytes, SingleProcessCommunicator(rank=0, size=1))
"""

from __future__ import annotations

import numpy as np

from meta.lv2.optimizers import Optimizer
from meta.lv3.allreduce import Allreduce
from meta.lv3.averaging import ModelAveraging, RingAveraging
from meta.lv3.communicator import Communicator
from meta.lv3.compression import make_compressor
from meta.lv3.downpour import Downpour
from meta.lv3.parameter_server import AsyncParameterServer, ParameterServer
from meta.lv3.rma import AsyncRMA
from meta.lv3.sandblaster import RowsEvaluator, Sandblaster
from meta.lv3.strategy import DEFAULT_CHUNK_BYTES, Strategy
from meta.lv3.timeline import Timeline

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (Allreduce, ParameterServer, AsyncParameterServer, ModelAveraging, RingAveraging,
                AsyncRMA, Downpour, Sandblaster)
}


def strategy_class(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {name!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def replica(name: str, rank: int, size: int, *, servers: int = 1) -> tuple[int, int]:
    """(index among the training ranks, their number) for ``rank`` under strategy ``name``;
    ``servers`` is the number of Downpour shard servers (which train nothing)."""
    cls = strategy_class(name)
    if cls is Downpour:
        return Downpour.replica(rank, size, servers)
    return cls.replica(rank, size)


def make_strategy(name: str, optimizer: Optimizer, comm: Communicator | None = None, *,
                  average_every: int = 1, compression: str = "none", topk_ratio: float = 0.01,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES, servers: int = 1, n_fetch: int = 1,
                  n_push: int = 1, warm_start_steps: int = 0, portions: int = 8,
                  evaluate: RowsEvaluator | None = None,
                  timeline: Timeline | None = None) -> Strategy:
    """Wrap ``optimizer`` in the strategy called ``name`` (a collective: every rank calls it).

    ``compression`` (none, fp16, topk, sign) applies to the gradient exchange of "allreduce";
    ``average_every`` is the H of "model_averaging"; ``servers``, ``n_fetch``, ``n_push`` and
    ``warm_start_steps`` configure "downpour"; "sandblaster" wraps an ``LBFGS`` and takes
    ``servers``, ``portions`` and ``evaluate`` (its workers' ``RowsEvaluator``).
    """
    cls = strategy_class(name)
    options = {"chunk_bytes": chunk_bytes, "timeline": timeline}
    if compression != "none" and cls is not Allreduce:
        raise ValueError(f"compression {compression!r} applies to distributed='allreduce' only, "
                         f"not {name!r}")
    if cls is Allreduce:
        n = sum(int(np.prod(np.shape(p))) for p in optimizer.params.values())
        dtypes = {np.asarray(p).dtype for p in optimizer.params.values()} or {np.dtype(float)}
        compressor = make_compressor(compression, n, dtypes.pop(), topk_ratio)
        return Allreduce(optimizer, comm, compressor=compressor, **options)
    if cls is ModelAveraging:
        return ModelAveraging(optimizer, comm, every=average_every, **options)
    if cls is Sandblaster:
        return Sandblaster(optimizer, comm, evaluate=evaluate, servers=servers,  # type: ignore
                           portions=portions, **options)
    if cls is Downpour:
        return Downpour(optimizer, comm, servers=servers, n_fetch=n_fetch, n_push=n_push,
                        warm_start_steps=warm_start_steps, **options)
    return cls(optimizer, comm, **options)
