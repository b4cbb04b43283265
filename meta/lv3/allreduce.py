"""Synchronous data parallelism: average gradients over ranks, then step any Level 2 optimizer."""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.component import Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3 import quantization  # noqa: F401  (registers the qsgd and terngrad compressions)
from meta.lv3.communicator import Communicator
from meta.lv3.compression import COMPRESSIONS, Compressor, compression_options, make_compressor
from meta.lv3.costmodel import Link, allgather, ring_allreduce
from meta.lv3.strategy import Strategy


class Allreduce(Strategy):
    """Every rank applies the mean gradient over all ranks: one fused, chunked allreduce.

    Ranks stay bit-identical, because each applies the same update to the same values. The
    inner optimizer's state is not broadcast: build it the same way on every rank. With a
    ``compressor`` each rank's payload is exchanged by one allgather instead, and every rank
    decompresses and sums all of them (in rank order, so ranks still agree bit for bit). A
    stochastic compressor (qsgd, terngrad) draws from a stream seeded by the recipe's seed and
    the rank.

    >>> from meta.lv2.optimizers import sgd
    >>> opt = Allreduce(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """

    name = "allreduce"
    options = {**Strategy.options,
               "compression": Option("none", "of the gradient exchange: fp16, topk, sign "
                                     "(topk and sign with error feedback), qsgd or terngrad",
                                     choices=("none", *COMPRESSIONS.names())),
               **compression_options()}
    pretraining = "average"

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, trainer: Any,
                    compression: str = "none", **options: Any) -> Allreduce:
        n = sum(int(np.prod(np.shape(p))) for p in optimizer.params.values())
        dtypes = {np.asarray(p).dtype for p in optimizer.params.values()} or {np.dtype(float)}
        offered = compression_options()
        chosen = {k: options.pop(k) for k in list(options) if k in offered}
        seed = [getattr(getattr(trainer, "sampler", None), "seed", 0), comm.rank]
        compressor = make_compressor(compression, n, dtypes.pop(), seed, **chosen)
        return cls(optimizer, comm, compressor=compressor, **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 compressor: Compressor | None = None, **options) -> None:
        super().__init__(optimizer, comm, **options)
        if compressor is not None and compressor.n != len(self.flat_grads):
            raise ValueError(f"Allreduce: the compressor is for {compressor.n} values, the "
                             f"gradients have {len(self.flat_grads)}")
        self.compressor = compressor

    def step(self, grads: Params) -> None:
        """Average ``grads`` over ranks and apply the inner optimizer's update."""
        if callable(grads):  # a line-search optimizer's closure, on one process (``check``)
            self.optimizer.step(grads)
            return
        t = self.timeline
        t.begin()
        buffer = self.flat_grads.pack(grads)
        t.lap("pack")
        if self.compressor is None:
            self.average(self.grad_chunks, buffer)
        else:
            self._exchange_compressed(buffer)
        # The views are overwritten by the next step: a transform must not keep them in its state.
        self.optimizer.step(self.flat_grads.views)
        t.lap("update")

    def _exchange_compressed(self, buffer: np.ndarray) -> None:
        payload = self.compressor.compress(buffer)
        self.timeline.lap("pack")
        everyone = self.comm.allgather(payload)
        self.bytes_sent += payload.nbytes
        self.timeline.lap("communicate")
        buffer.fill(0)
        for row in everyone:
            self.compressor.decode_add(row, buffer)
        buffer *= 1.0 / self.comm.size
        self.timeline.lap("unpack")

    def predict_comm_s(self, link: Link) -> float:
        p = self.comm.size
        if self.compressor is None:
            return ring_allreduce(link, p, self.flat_grads.nbytes)
        return allgather(link, p, self.compressor.payload_bytes)


AllreduceOptimizer = Allreduce  # the name it had before the strategy family


def allreduce_mean(comm: Communicator, values: np.ndarray | float) -> np.ndarray:
    """Mean of ``values`` over ranks, as a new float64 array (for metrics such as the loss).

    >>> from meta.lv3 import world
    >>> allreduce_mean(world(), [1.0, 3.0]).tolist()
    [1.0, 3.0]
    """
    out = np.array(values, dtype=np.float64)  # a fresh contiguous copy: the input is untouched
    comm.allreduce(out, op="sum")
    out /= comm.size
    return out
