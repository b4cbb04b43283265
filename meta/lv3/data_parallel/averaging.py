"""Decentralised strategies that average parameters, not gradients: local SGD and a ring."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from meta.common.component import Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm import tags
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link, ring_allreduce
from meta.lv3.strategy import Strategy
from meta.lv3.workload import Workload

RING_TAG = tags.RING


class ModelAveraging(Strategy):
    """Local SGD: each rank steps on its own gradients; every ``average_every`` steps (H) the
    ranks replace their parameters by the mean over ranks. With H = 1 and plain SGD this is
    gradient averaging (up to rounding). Optimizer state (momentum) stays local.
    """

    name = "model_averaging"
    options = {**Strategy.options,
               "average_every": Option(1, "steps between averages (H)", low=1,
                                       aliases=("every",))}

    @classmethod
    def from_recipe(cls, optimizer: Optimizer, comm: Communicator, workload: Workload | None,
                    average_every: int = 1, **options: Any) -> ModelAveraging:
        return cls(optimizer, comm, average_every=average_every, **options)

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 average_every: int = 1, *, every: int | None = None, **options) -> None:
        """``every``: ``average_every``'s former name (as ``neighbours`` names it), read with a
        DeprecationWarning."""
        if every is not None:
            warnings.warn("ModelAveraging: 'every' is now 'average_every' (as the neighbours "
                          "strategy names it); the old name will be removed",
                          DeprecationWarning, stacklevel=2)
            average_every = every
        if isinstance(average_every, bool) or not isinstance(average_every, int) \
                or average_every < 1:
            raise ValueError(f"ModelAveraging: average_every must be an int >= 1, got "
                             f"{average_every!r}")
        super().__init__(optimizer, comm, **options)
        self.average_every = average_every
        """H: steps between averages of the parameters."""
        self.consistent = average_every == 1
        self._since_average = 0

    @property
    def every(self) -> int:
        """``average_every``'s former name."""
        return self.average_every

    def step(self, grads: Params) -> None:
        self.timeline.begin()
        self.optimizer.step(grads)
        self.timeline.lap("update")
        self._since_average += 1
        if self._since_average == self.average_every:
            self._since_average = 0
            self.average(self.param_chunks, self.flat_params.buffer)

    def finish(self) -> None:
        if self._since_average:
            self._since_average = 0
            self.average(self.param_chunks, self.flat_params.buffer)

    def predict_comm_s(self, link: Link) -> float:
        return ring_allreduce(link, self.comm.size, self.flat_params.nbytes) / \
            self.average_every


class RingAveraging(Strategy):
    """Each rank steps on its own gradients, then averages its parameters with its two ring
    neighbours (rank ± 1 mod P; one neighbour at P = 2), by nonblocking tagged messages.
    Replicas differ during training; ``finish`` averages them all once.
    """

    name = "ring"
    consistent = False

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None,
                 **options) -> None:
        super().__init__(optimizer, comm, **options)
        r, p = self.comm.rank, self.comm.size
        self.neighbours = sorted({(r - 1) % p, (r + 1) % p} - {r})
        """The ring neighbours this rank averages with: rank - 1 and rank + 1 mod P (one at P =
        2, none at P = 1)."""
        self.inbox = np.empty((len(self.neighbours), len(self.flat_params)),
                              self.flat_params.dtype)
        """One row per neighbour: its parameters, received each step."""

    def step(self, grads: Params) -> None:
        t, comm, params = self.timeline, self.comm, self.flat_params.buffer
        t.begin()
        self.optimizer.step(grads)
        t.lap("update")
        if not self.neighbours:
            return
        requests = [comm.irecv(row, n, RING_TAG) for row, n in zip(self.inbox, self.neighbours)]
        requests += [comm.isend(params, n, RING_TAG) for n in self.neighbours]
        comm.waitall(requests)
        self.bytes_sent += params.nbytes * len(self.neighbours)
        t.lap("communicate")
        for row in self.inbox:
            params += row
        params *= 1.0 / (1 + len(self.neighbours))
        t.lap("unpack")

    def finish(self) -> None:
        self.average(self.param_chunks, self.flat_params.buffer)

    def predict_comm_s(self, link: Link) -> float:
        return len(self.neighbours) * link.message(self.flat_params.nbytes)
