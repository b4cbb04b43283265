"""Decentralised averaging over an MPI process topology, by neighbourhood collectives (seed 004).

Beside ``RingAveraging``'s hand-written messages to rank ± 1, ``NeighbourAveraging`` lets MPI
know the graph (``meta.lv3.comm.topology``: a periodic Cartesian grid or the exponential graph) and
moves the parameters to every neighbour with one ``Neighbor_allgather``. No rank ever waits for
all the others: a step costs ``degree`` messages however many ranks there are, where an
allreduce's latency grows with log P or P. The price is that replicas differ during training
(gossip, not consensus) and a global average is only approached over several steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.common.component import ComponentError, Option
from meta.lv2.optimizers import Optimizer, Params
from meta.lv3.comm.communicator import Communicator
from meta.lv3.comm.costmodel import Link
from meta.lv3.comm.polling import poll_all
from meta.lv3.comm.topology import KINDS, topology
from meta.lv3.strategy import Strategy


class NeighbourAveraging(Strategy):
    """Each rank steps on its own gradients, then every ``average_every`` steps replaces its
    parameters by their mean with its in-neighbours' (one ``Neighbor_allgather``) on a
    ``topology``: "cart" (a periodic grid of ``cart_dims`` dimensions: 1 a ring, 2 a torus) or
    "graph" (the exponential graph: log2 P neighbours). Uniform weights on a regular graph are
    doubly stochastic, so the replicas drift towards their mean; ``finish`` takes that mean
    exactly (one allreduce) and reports how far the replicas were from it
    (``replica_spread``: RMS distance over ranks, relative to the mean's norm).
    """

    name = "neighbours"
    consistent = False
    options = {**Strategy.options,
               "topology": Option("cart", "the neighbourhood: 'cart' (periodic grid) or "
                                  "'graph' (exponential graph)", choices=KINDS),
               "cart_dims": Option(1, "dimensions of the 'cart' grid (1: ring, 2: torus)",
                                   low=1),
               "average_every": Option(1, "steps between neighbour averages", low=1)}

    def __init__(self, optimizer: Optimizer, comm: Communicator | None = None, *,
                 topology: str = "cart", cart_dims: int = 1, average_every: int = 1,
                 **options: Any) -> None:
        if isinstance(average_every, bool) or not isinstance(average_every, int) \
                or average_every < 1:
            raise ValueError(f"NeighbourAveraging: average_every must be an int >= 1, got "
                             f"{average_every!r}")
        super().__init__(optimizer, comm, **options)
        self.kind, self.average_every = topology, average_every
        """``kind``: the topology, "cart" or "graph". ``average_every``: steps between
        averages with the neighbours."""
        self.neighbourhood = _topology(self.comm, topology, cart_dims)
        """The MPI topology communicator whose in-neighbours (``sources``) this rank averages
        with."""
        self.inbox = np.empty((len(self.neighbourhood.sources), len(self.flat_params)),
                              self.flat_params.dtype)
        """One row per in-neighbour: its parameters, gathered at each average."""
        self._since_average = 0
        self.replica_spread = 0.0
        """After ``finish``: the replicas' root-mean-square distance from their mean, relative to
        the mean's norm (0 until then)."""

    def step(self, grads: Params) -> None:
        t = self.timeline
        t.begin()
        self.optimizer.step(grads)
        t.lap("update")
        self._since_average += 1
        if self._since_average == self.average_every:
            self._since_average = 0
            self.mix()

    def mix(self) -> None:
        """Average with the in-neighbours (nothing to do without any)."""
        t, hood, params = self.timeline, self.neighbourhood, self.flat_params.buffer
        if not len(hood.sources):
            return
        request = hood.ineighbor_allgather(params, self.inbox)
        # MPICH's blocking wait spins; with more ranks than cores it starves the neighbours.
        if self.oversubscribed:
            poll_all(hood, [request])
        else:
            hood.wait(request)
        self.bytes_sent += params.nbytes * len(hood.destinations)
        t.lap("communicate")
        params += self.inbox.sum(axis=0)
        params *= 1.0 / (1 + len(hood.sources))
        t.lap("unpack")

    def finish(self) -> None:
        """The exact mean over all ranks, and how far this rank's replica was from it."""
        if self.comm.size == 1:
            return
        before = self.flat_params.buffer.copy()
        self.average(self.param_chunks, self.flat_params.buffer)
        spread = np.array([float(np.sum((before - self.flat_params.buffer) ** 2))])
        self.comm.allreduce(spread)
        norm = float(np.linalg.norm(self.flat_params.buffer)) or 1.0
        self.replica_spread = float(np.sqrt(spread[0] / self.comm.size)) / norm

    def report(self) -> dict[str, float]:
        out = super().report()
        out.update(neighbours=float(len(self.neighbourhood.sources)),
                   replica_spread=self.replica_spread)
        return out

    def predict_comm_s(self, link: Link) -> float:
        """``degree`` messages of the whole parameter vector every ``average_every`` steps."""
        messages = len(self.neighbourhood.destinations)
        return messages * link.message(self.flat_params.nbytes) / self.average_every \
            if messages else 0.0


def _topology(comm: Communicator, kind: str, dims: int) -> Communicator:
    """``topology`` with its refusals as a recipe error (the message names the option)."""
    try:
        return topology(comm, kind, dims)
    except ValueError as err:
        raise ComponentError(f"distributed 'neighbours': {err}") from err
