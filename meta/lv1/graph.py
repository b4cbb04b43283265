"""The network graph: ONNX-shaped nodes over named tensors, with parameters as initializers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

Dim = int | str | None  # a fixed size, a symbolic name ("N"), or unknown


class GraphError(ValueError):
    """A graph that cannot be executed as given (the message names the node and tensor)."""


@dataclass
class Node:
    op_type: str
    inputs: list[str]  # "" marks an absent optional input, as in ONNX
    outputs: list[str]
    name: str = ""
    domain: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


@dataclass
class TensorInfo:
    """A graph input or output: name, element type and shape (dims may be symbolic)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...] | None = None

    def __post_init__(self) -> None:
        self.dtype = np.dtype(self.dtype)


class Graph:
    """A network: nodes sorted topologically, graph inputs/outputs, initializers and opsets.

    Parameters are the floating-point initializers; ``graph.parameters`` returns the arrays
    themselves, so an optimizer that updates them in place updates the network.
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        inputs: Iterable[TensorInfo],
        outputs: Iterable[TensorInfo],
        initializers: dict[str, np.ndarray] | None = None,
        opset: dict[str, int] | None = None,
        name: str = "graph",
    ) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.initializers = dict(initializers or {})
        self.opset = dict(opset or {"": 17})
        self.name = name
        for i, node in enumerate(nodes := list(nodes)):
            node.name = node.name or f"{node.op_type}_{i}"
        self.nodes = self._sorted(nodes)

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.initializers.items() if np.issubdtype(v.dtype, np.floating)}

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def _sorted(self, nodes: list[Node]) -> list[Node]:
        """Kahn's algorithm; names the node whose input nothing produces."""
        available = {t.name for t in self.inputs} | set(self.initializers)
        produced_by = {out: n for n in nodes for out in n.outputs if out}
        for node in nodes:
            for name in node.inputs:
                if name and name not in available and name not in produced_by:
                    raise GraphError(
                        f"{node.describe()}: input {name!r} is not a graph input, an initializer "
                        f"or the output of any node"
                    )
        order: list[Node] = []
        pending = list(nodes)
        while pending:
            ready = [n for n in pending if all(not x or x in available for x in n.inputs)]
            if not ready:
                cycle = ", ".join(n.describe() for n in pending[:5])
                raise GraphError(f"graph {self.name!r} has a cycle through {cycle}")
            for node in ready:
                order.append(node)
                available.update(o for o in node.outputs if o)
            pending = [n for n in pending if n not in ready]
        return order

    def nodes_for(self, outputs: Iterable[str]) -> list[Node]:
        """The nodes needed to compute ``outputs``, in execution order."""
        producers = self.producers()
        needed: set[str] = set()
        stack = list(outputs)
        while stack:
            name = stack.pop()
            node = producers.get(name)
            if node is not None and node.name not in needed:
                needed.add(node.name)
                stack.extend(x for x in node.inputs if x)
        return [n for n in self.nodes if n.name in needed]

    def __repr__(self) -> str:
        inputs, outputs = [t.name for t in self.inputs], [t.name for t in self.outputs]
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, {len(self.parameters)} "
                f"parameters, inputs={inputs}, outputs={outputs})")
