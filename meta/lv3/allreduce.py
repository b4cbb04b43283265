"""Synchronous data parallelism: average gradients over ranks, then step any Level 2 optimizer."""

from __future__ import annotations

import numpy as np

from meta.lv2.optimizers import Optimizer, Params, State
from meta.lv3.communicator import Communicator, world
from meta.lv3.flat import FlatBuffer


class AllreduceOptimizer:
    """Wraps an ``Optimizer`` so that every rank applies the mean gradient over all ranks.

    Construction broadcasts rank 0's parameters (in place, into the same arrays) so all ranks
    start equal; each ``step`` packs the gradients into one persistent buffer, sums it with a
    single allreduce, divides by the size and hands the inner optimizer views of that buffer.
    Ranks then stay bit-identical, because each applies the same update to the same values.
    The inner optimizer's state is not broadcast: build it the same way on every rank.

    >>> from meta.lv2.optimizers import sgd
    >>> opt = AllreduceOptimizer(Optimizer(sgd(0.1), {"w": np.array([1.0])}))
    >>> opt.step({"w": np.array([2.0])}); opt.params["w"].tolist()
    [0.8]
    """

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None) -> None:
        self.optimizer = optimizer
        self.comm = world() if comm is None else comm
        flat = FlatBuffer.like(optimizer.params)
        flat.pack(optimizer.params)
        self.comm.bcast(flat.buffer, root=0)
        flat.unpack_into(optimizer.params)
        # Persistent: one allocation for the whole run, and the same layout on every rank.
        self._grads = FlatBuffer(flat.shapes, flat.dtype)

    @property
    def params(self) -> Params:
        return self.optimizer.params

    @property
    def state(self) -> State:
        return self.optimizer.state

    def step(self, grads: Params) -> None:
        """Average ``grads`` over ranks (one allreduce) and apply the inner optimizer's update."""
        buffer = self._grads.pack(grads)
        if self.comm.size > 1:
            self.comm.allreduce(buffer, op="sum")
            buffer *= 1.0 / self.comm.size
        # The views are overwritten by the next step: a transform must not keep them in its state.
        self.optimizer.step(self._grads.views)


def allreduce_mean(comm: Communicator, values: np.ndarray | float) -> np.ndarray:
    """Mean of ``values`` over ranks, as a new float64 array (for metrics such as the loss).

    >>> allreduce_mean(world(), [1.0, 3.0]).tolist()
    [1.0, 3.0]
    """
    out = np.array(values, dtype=np.float64)  # a fresh contiguous copy: the input is untouched
    comm.allreduce(out, op="sum")
    out /= comm.size
    return out
