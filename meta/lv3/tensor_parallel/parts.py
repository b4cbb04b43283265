"""What a tensor-parallel plan is made of (``plan`` makes it, ``sequence`` splits its
replicated part by rows): how each rank holds an initializer (``Shard``), what each node
became (``Layer``), the collectives of a step (``Collective``) and one rank's ``Plan``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from meta.lv1.graph import Graph, Node
from meta.lv3.tensor_parallel.ops import DOMAIN, register_operators


@dataclass
class Shard:
    """How one rank holds an initializer of the whole graph: all of it (``axis`` None), the
    ``indices`` along ``axis``, or, when ``owner`` is set, all of it on that rank alone."""

    axis: int | None = None
    """The axis it is split along; None: whole (on every rank, or on ``owner``)."""
    indices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """The indices along ``axis`` this rank holds."""
    owner: int | None = None
    """The one rank that holds it whole, where set."""

    def held_by(self, rank: int) -> bool:
        return self.owner is None or self.owner == rank

    @property
    def split(self) -> bool:
        return self.axis is not None or self.owner is not None

    def shape(self, full: tuple[int, ...]) -> tuple[int, ...]:
        if self.axis is None:
            return tuple(full)
        return tuple(len(self.indices) if a == self.axis else d for a, d in enumerate(full))

    def take(self, array: np.ndarray) -> np.ndarray:
        """This rank's part of the whole ``array`` (a contiguous copy, or ``array`` itself)."""
        if self.axis is None:
            return array
        return np.ascontiguousarray(np.take(array, self.indices, axis=self.axis))

    def put(self, array: np.ndarray, part: np.ndarray) -> None:
        """Write this rank's ``part`` into the whole ``array``."""
        if self.axis is None:
            array[...] = part
        else:
            index = [slice(None)] * array.ndim
            index[self.axis] = self.indices
            array[tuple(index)] = part


@dataclass
class Layer:
    """What one node of the whole graph became on this rank: ``kind`` is column, row,
    grouped (split, no communication), split (an elementwise op on split features) or
    replicated; ``share`` is the fraction of the node's work this rank does."""

    kind: str
    """column, row, grouped, split or replicated."""
    share: float = 1.0
    """The fraction of the node's work this rank does."""


@dataclass
class Collective:
    """An allreduce one step makes: of which tensor (its gradient, backward), forward or
    backward, and the elements per example of the buffer each rank sends."""

    tensor: str
    """The tensor reduced (its gradient, in the backward)."""
    phase: str
    """"forward" or "backward"."""
    elements: int
    """Elements per example of the buffer each rank sends."""
    itemsize: int
    """Bytes per element."""
    kind: str = "allreduce"
    """allreduce, reduce_scatter or allgather (of the whole buffer's rows: ``sequence``)."""
    fixed: int = 0
    """Bytes that do not grow with the batch (a loss's sums, the gradients of parameters
    that every rank holds and the row-split part of the graph reads)."""

    def nbytes(self, batch: int) -> int:
        return batch * self.elements * self.itemsize + self.fixed

    @property
    def label(self) -> str:
        """Its kind as the report prints it (allreduce, reduce-scatter, all-gather)."""
        return {"allgather": "all-gather", "reduce_scatter": "reduce-scatter"}.get(
            self.kind, self.kind)


@dataclass
class Plan:
    """This rank's nodes, every rank's shards of the initializers it reads, what each node of
    the whole graph became here, and the collectives of a training step."""

    rank: int
    """This rank."""
    ranks: int
    """Ranks the graph is split over."""
    nodes: list[Node]
    """This rank's nodes, in order."""
    shards: dict[str, list[Shard]]
    """initializer -> one Shard per rank"""
    layers: dict[str, Layer]
    """What each node of the whole graph became here, by name."""
    collectives: list[Collective]
    """The allreduces of a training step."""
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    """this rank's own (shapes)"""
    partial_gradients: list[str] = field(default_factory=list)
    """Parameters every rank holds whole whose gradient on each rank is that of its own rows
    (``sequence``): summed over the ranks after the backward."""
    partial_outputs: list[str] = field(default_factory=list)
    """Graph outputs of which each rank computes a part (``sequence``: a mean loss over
    every rank's rows): summed over the ranks, with the gradients in training."""

    def bytes_of(self, graph: Graph, role: str = "parameter") -> int:
        """Bytes of ``role`` initializers this rank holds."""
        roles, total = graph.roles, 0
        for name, shards in self.shards.items():
            shard, full = shards[self.rank], graph.initializers[name]
            if roles[name] == role and shard.held_by(self.rank):
                total += math.prod(shard.shape(full.shape)) * full.itemsize
        return total

    def step_bytes(self, batch: int, training: bool = True) -> int:
        """Bytes this rank sends in one step of ``batch`` examples (forward only if not
        ``training``)."""
        return sum(c.nbytes(batch) for c in self.collectives
                   if training or c.phase == "forward")

    def count(self, kind: str) -> int:
        return sum(1 for layer in self.layers.values() if layer.kind == kind)

    def local_graph(self, graph: Graph) -> Graph:
        """This rank's graph: its nodes, its parts of the initializers (split ones copied,
        whole ones shared with ``graph``), the roles of ``graph``."""
        register_operators()
        initializers = {}
        for name, shards in self.shards.items():
            shard = shards[self.rank]
            if shard.held_by(self.rank):
                initializers[name] = shard.take(graph.initializers[name])
        initializers.update(self.constants)
        local = Graph([dataclasses.replace(n, inputs=list(n.inputs), attrs=dict(n.attrs))
                       for n in self.nodes], graph.inputs, graph.outputs, initializers,
                      {**graph.opset, DOMAIN: 1}, f"{graph.name}.part{self.rank}")
        roles = graph.roles
        local.role_overrides = {k: roles[k] for k in initializers if k not in self.constants}
        return local
