"""Communicators with a neighbourhood: MPI's process topologies and neighbourhood collectives.

A decentralised strategy talks to a few neighbours, not to every rank. MPI describes who the
neighbours are with a *process topology* attached to a communicator: a periodic Cartesian grid
(``Create_cart``: a ring in one dimension, a torus in two) or an arbitrary directed graph
(``Create_dist_graph_adjacent``), and moves one buffer to all of them at once with the
neighbourhood collectives (``Neighbor_allgather``: the same buffer to every out-neighbour;
``Neighbor_alltoall``: a different block to each). Kept apart from ``MPICommunicator`` so that
the communicator every strategy uses stays small: only the strategies that need a topology
build one (``topology(comm, ...)``), and at size 1 they get ``SingleProcessTopology``, which has
no neighbours.

>>> from meta.lv3.comm.communicator import SingleProcessCommunicator
>>> ring = topology(SingleProcessCommunicator(), "cart", dims=1)
>>> ring.sources, ring.neighbor_allgather(np.ones(3)).shape
([], (0, 3))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.lv3.comm.communicator import (
    Communicator,
    MPICommunicator,
    SingleProcessCommunicator,
    _check_buffer,
)

KINDS = ("cart", "graph")


def exponential_offsets(size: int) -> list[int]:
    """The static exponential graph's hops: rank r sends to r + 2^k (mod P) for 2^k < P.

    log2(P) neighbours each, and every rank is reached from every other in log2(P) hops, so
    averaging mixes fast (Assran et al.'s stochastic gradient push uses it). A circulant graph,
    so uniform weights are doubly stochastic: repeated averaging converges to the mean.

    >>> exponential_offsets(8), exponential_offsets(2), exponential_offsets(1)
    ([1, 2, 4], [1], [])
    """
    offsets, hop = [], 1
    while hop < size:
        offsets.append(hop)
        hop *= 2
    return offsets


class SingleProcessTopology(SingleProcessCommunicator):
    """Size 1: no neighbours; the neighbourhood collectives return zero rows."""

    sources: list[int] = []
    """The ranks this one receives from: none on one process."""
    destinations: list[int] = []
    """The ranks this one sends to: none on one process."""

    def neighbor_allgather(self, buf: np.ndarray) -> np.ndarray:
        _check_buffer(buf, "neighbor_allgather", writeable=False)
        return np.empty((0, *buf.shape), buf.dtype)

    def ineighbor_allgather(self, buf: np.ndarray, out: np.ndarray) -> Any:
        self.neighbor_allgather(buf)
        return None

    def neighbor_alltoall(self, blocks: np.ndarray) -> np.ndarray:
        _check_buffer(blocks, "neighbor_alltoall", writeable=False)
        if len(blocks):
            raise ValueError(f"neighbor_alltoall: {len(blocks)} blocks for 0 out-neighbours")
        return np.empty_like(blocks)


class TopologyCommunicator(MPICommunicator):
    """An ``MPICommunicator`` whose mpi4py communicator carries a Cartesian or graph topology.

    ``sources`` are the in-neighbours (in MPI's order: the rows ``neighbor_allgather``
    returns), ``destinations`` the out-neighbours. On a Cartesian grid a neighbour may appear
    twice (a periodic dimension of size 2 has the same rank on both sides): MPI sends to it
    twice, and averaging weights it twice, which keeps the mixing symmetric.
    """

    def __init__(self, comm: Any) -> None:
        super().__init__(comm)
        # A grid lists, per dimension, the -1 then the +1 side; a graph its adjacency lists.
        self.sources, self.destinations = list(comm.inedges), list(comm.outedges)
        """``sources``: the ranks this one receives from (in-neighbours). ``destinations``: those
        it sends to."""

    def neighbor_allgather(self, buf: np.ndarray) -> np.ndarray:
        """Each in-neighbour's ``buf``, one row per ``sources`` entry."""
        out = np.empty((len(self.sources), *buf.shape), buf.dtype)
        self.comm.Neighbor_allgather(_check_buffer(buf, "neighbor_allgather", False), out)
        return out

    def ineighbor_allgather(self, buf: np.ndarray, out: np.ndarray) -> Any:
        """Start ``neighbor_allgather`` into ``out`` (shape ``(len(sources), *buf.shape)``)."""
        if out.shape != (len(self.sources), *buf.shape):
            raise ValueError(f"ineighbor_allgather: out has shape {out.shape}, expected "
                             f"{(len(self.sources), *buf.shape)} for {len(self.sources)} "
                             "in-neighbours")
        return self.comm.Ineighbor_allgather(_check_buffer(buf, "ineighbor_allgather", False),
                                             _check_buffer(out, "ineighbor_allgather"))

    def neighbor_alltoall(self, blocks: np.ndarray) -> np.ndarray:
        """Row i of ``blocks`` to ``destinations[i]``; returns one row per ``sources`` entry."""
        _check_buffer(blocks, "neighbor_alltoall", writeable=False)
        if len(blocks) != len(self.destinations):
            raise ValueError(f"neighbor_alltoall: {len(blocks)} blocks for "
                             f"{len(self.destinations)} out-neighbours")
        out = np.empty((len(self.sources), *blocks.shape[1:]), blocks.dtype)
        self.comm.Neighbor_alltoall(blocks, out)
        return out


def topology(comm: Communicator, kind: str = "cart", dims: int = 1) -> Communicator:
    """``comm`` with neighbours (a collective): ``kind`` "cart", a periodic grid of ``dims``
    dimensions (``MPI.Compute_dims`` balances their sizes; 1 is a ring, 2 a torus), or
    "graph", the static exponential graph (``exponential_offsets``) as a distributed graph."""
    if kind not in KINDS:
        raise ValueError(f"topology: unknown kind {kind!r}; expected one of {KINDS}")
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise ValueError(f"topology: dims must be an int >= 1, got {dims!r}")
    if comm.size == 1:
        return SingleProcessTopology()
    if not isinstance(comm, MPICommunicator):
        raise TypeError(f"topology: needs an MPICommunicator at size {comm.size}, got {comm!r}")
    MPI = comm._MPI  # noqa: N806 - the module's conventional name
    if kind == "cart":
        shape = MPI.Compute_dims(comm.size, dims)
        return TopologyCommunicator(comm.comm.Create_cart(shape, periods=[True] * dims,
                                                          reorder=False))
    offsets = exponential_offsets(comm.size)
    r, p = comm.rank, comm.size
    return TopologyCommunicator(comm.comm.Create_dist_graph_adjacent(
        [(r - k) % p for k in offsets], [(r + k) % p for k in offsets], reorder=False))
