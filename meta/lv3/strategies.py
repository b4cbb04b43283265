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
from meta.lv3.parameter_server import AsyncParameterServer, ParameterServer
from meta.lv3.strategy import DEFAULT_CHUNK_BYTES, Strategy
from meta.lv3.timeline import Timeline

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (Allreduce, ParameterServer, AsyncParameterServer, ModelAveraging, RingAveraging)
}


def strategy_class(name: str) -> type[Strategy]:
    if name not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {name!r}; expected one of "
                         f"{', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def make_strategy(name: str, optimizer: Optimizer, comm: Communicator | None = None, *,
                  average_every: int = 1, compression: str = "none", topk_ratio: float = 0.01,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  timeline: Timeline | None = None) -> Strategy:
    """Wrap ``optimizer`` in the strategy called ``name`` (a collective: every rank calls it).

    ``compression`` (none, fp16, topk, sign) applies to the gradient exchange of "allreduce";
    ``average_every`` is the H of "model_averaging".
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
    return cls(optimizer, comm, **options)
