"""The network graph: ONNX-shaped nodes over named tensors, with parameters as initializers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from meta.lv0 import Operator, UnknownOperatorError, lookup
from meta.lv1 import roles as _roles
from meta.lv1.roles import TensorView

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
        """The node as messages name it: ``node 'conv1' (Conv)``."""
        return f"node {self.name!r} ({self.op_type})"

    def subgraphs(self) -> Iterator[Graph]:
        """The graphs held in attributes (If branches, Loop bodies)."""
        for value in self.attrs.values():
            if isinstance(value, Graph):
                yield value
            elif isinstance(value, list):
                yield from (v for v in value if isinstance(v, Graph))

    def dependencies(self) -> list[str]:
        """Tensors this node reads: its inputs plus what its subgraphs take from outside."""
        deps = [x for x in self.inputs if x]
        for sub in self.subgraphs():
            deps.extend(sub.free_names())
        return deps


@dataclass
class TensorInfo:
    """A graph input, output or intermediate: name, element type (``None``: unknown) and shape
    (``None``: unknown rank; dims may be symbolic)."""

    name: str
    dtype: np.dtype | None
    shape: tuple[Dim, ...] | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None:
            self.dtype = np.dtype(self.dtype)


def canonical_domain(domain: str) -> str:
    """ONNX spells the default domain both "" and "ai.onnx"; we use ""."""
    return "" if domain in ("", "ai.onnx") else domain


def make_operator(node: Node, opset: dict[str, int],
                  backends: Sequence[str] = ("numpy",)) -> Operator:
    """The configured operator instance for ``node`` under the model's ``opset`` imports.

    Both the ONNX loader and the executors resolve nodes here, so an unknown op or attribute
    fails with the same message, naming the node, op, domain and opset.
    """
    domain = canonical_domain(node.domain)
    version = opset.get(domain, 1 if domain else opset.get("", 1))
    try:
        cls = lookup(node.op_type, version, domain, backends)
        op = cls(**node.attrs)
    except (UnknownOperatorError, TypeError) as err:
        raise GraphError(f"{node.describe()}: {err}") from err
    if hasattr(op, "n_outputs"):  # ops whose output count is not an attribute (Split < 18)
        op.n_outputs = len(node.outputs)
    return op


class Graph:
    """A network: nodes sorted topologically, graph inputs/outputs, initializers and opsets.

    Initializers have one role each (``meta.lv1.roles``): trainable ``parameters``, ``frozen``
    parameters, ``state`` (BatchNorm's running statistics: updated in training mode, never by
    an optimizer) and ``constants``; ``roles`` maps every name to its role and ``train_only``,
    ``freeze`` and ``unfreeze`` override it. ``graph.parameters`` and ``graph.state`` read and
    write the graph's own arrays (``TensorView``), so an optimizer or a strategy that updates
    or re-points them updates the network. A graph input that has the name of an initializer
    is an optional feed defaulting to the initializer.
    ``value_info`` holds what is known of intermediate tensors (from ONNX files). A subgraph
    (an If branch) names the tensors it may read from its enclosing graph in ``outer_scope``.

    Editing keeps the graph valid: ``insert``, ``replace`` and ``remove`` re-sort the nodes and
    refuse (leaving the graph unchanged) an edit that leaves an input dangling or makes a cycle.

    >>> g = Graph([Node("Relu", ["x"], ["y"], "r")], [TensorInfo("x", np.float32, (2,))],
    ...           [TensorInfo("y", np.float32, (2,))])
    >>> g.insert(Node("Neg", ["x"], ["nx"], "neg"), before="r")
    >>> g.node("r").inputs = ["nx"]; [n.name for n in g.sorted_nodes()]
    ['neg', 'r']
    """

    def __init__(
        self,
        nodes: Iterable[Node],
        inputs: Iterable[TensorInfo],
        outputs: Iterable[TensorInfo],
        initializers: dict[str, np.ndarray] | None = None,
        opset: dict[str, int] | None = None,
        name: str = "graph",
        value_info: dict[str, TensorInfo] | None = None,
        outer_scope: Iterable[str] = (),
    ) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.initializers = dict(initializers or {})
        self.opset = dict(opset or {"": 17})
        self.name = name
        self.value_info = dict(value_info or {})
        self.outer_scope = frozenset(outer_scope)
        self.role_overrides: dict[str, str] = {}  # by name: what the user chose
        # Bumped by every change to the initializers' values that meta makes (``touch``): an
        # executor that keeps weights in its own layouts re-reads them when it moved.
        self.version = 0
        # What the file says of its initializers (``meta.lv1.roles`` reads them): the exporter's
        # marks (PARAMETER, BUFFER), the parameters of its graph signature, what its optimizer
        # folded each new initializer from; ``notes``: one line per thing a user should know.
        self.exporter_marks: dict[str, str] = {}
        self.signature_parameters: set[str] = set()
        self.folded_from: dict[str, list[str]] = {}
        self.notes: list[str] = []
        # Initializers the exporter duplicated from one tied parameter, kept as one: derived
        # name -> (source, "equal" or "transpose", the node computing it; ``meta.lv1.ties``).
        self.ties: dict[str, tuple[str, str, str]] = {}
        self._default_roles: dict[str, str] | None = None  # derived; reset by every edit
        nodes = list(nodes)
        seen: set[str] = set()
        for i, node in enumerate(nodes):
            base = node.name or f"{node.op_type}_{i}"
            unique, k = base, 1
            while unique in seen:  # ONNX does not require unique node names; we key on them
                unique, k = f"{base}_{k}", k + 1
            node.name = unique
            seen.add(unique)
        self.nodes = self._sorted(nodes)

    # -- roles of the initializers ---------------------------------------------------------
    @property
    def roles(self) -> dict[str, str]:
        """Initializer name -> "parameter", "frozen", "state" or "constant"."""
        if self._default_roles is None or self._default_roles.keys() != self.initializers.keys():
            self._default_roles = _roles.default_roles(self, self.declared_operator)
        return {**self._default_roles,
                **{k: v for k, v in self.role_overrides.items() if k in self.initializers}}

    def declared_operator(self, node: Node) -> Operator | None:
        """``node``'s operator, or None while its op is not registered (yet): what the roles
        read the operators' declarations from."""
        try:
            return make_operator(node, self.opset)
        except (GraphError, UnknownOperatorError):
            return None

    def touch(self) -> None:
        """Say the initializers' values changed (``version`` moves on). Optimizers, strategies,
        checkpoint loading and the graph's own edits call it; call it after writing into a
        weight array yourself (``graph.initializers[name][...] = ...``), or a planned
        executor's inference plan keeps the values it reordered before."""
        self.version += 1

    def _view(self, role: str) -> TensorView:
        roles = self.roles
        return TensorView(self.initializers, [k for k in self.initializers if roles[k] == role],
                          role, self.touch)

    @property
    def parameters(self) -> TensorView:
        """The trainable parameters: what optimizers, weight decay and strategies see."""
        return self._view(_roles.PARAMETER)

    @property
    def state(self) -> TensorView:
        """Tensors ops update in training mode (running statistics): checkpointed, kept
        consistent across replicas, never given a gradient."""
        return self._view(_roles.STATE)

    @property
    def frozen(self) -> TensorView:
        """The parameters frozen (kept out of training): a view of the graph's arrays by name."""
        return self._view(_roles.FROZEN)

    @property
    def constants(self) -> TensorView:
        """The initializers that are constants (settings such as Reshape's shape, not learned): a
        view by name."""
        return self._view(_roles.CONSTANT)

    def freeze(self, *patterns: str) -> list[str]:
        """Stop training the parameters matching any shell-style pattern; returns their names."""
        roles = self.roles
        names = _roles.matching([k for k, r in roles.items() if r in (_roles.PARAMETER,
                                                                       _roles.FROZEN)],
                                patterns, f"graph {self.name!r}: freeze")
        self.role_overrides.update(dict.fromkeys(names, _roles.FROZEN))
        self.touch()
        return names

    def unfreeze(self, *patterns: str) -> list[str]:
        """Train the float initializers matching any pattern (frozen ones, or constants such
        as a learned 0-d scale); state stays state."""
        roles = self.roles
        candidates = [k for k, r in roles.items() if r != _roles.STATE
                      and np.issubdtype(self.initializers[k].dtype, np.floating)]
        names = _roles.matching(candidates, patterns, f"graph {self.name!r}: unfreeze")
        self.role_overrides.update(dict.fromkeys(names, _roles.PARAMETER))
        self.touch()
        return names

    def select(self, trainable: Iterable[str] = (), frozen: Iterable[str] = ()) -> None:
        """``train_only(*trainable)`` (if any), then ``freeze(*frozen)``: the selection a
        loader or a recipe passes as two lists of patterns."""
        if trainable:
            self.train_only(*trainable)
        if frozen:
            self.freeze(*frozen)

    def train_only(self, *patterns: str) -> list[str]:
        """Train exactly the parameters matching the patterns; freeze every other one."""
        roles = self.roles
        keep = set(self.unfreeze(*patterns))
        others = [k for k, r in roles.items() if r == _roles.PARAMETER and k not in keep]
        self.role_overrides.update(dict.fromkeys(others, _roles.FROZEN))
        return sorted(keep)

    # -- reading -------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        """Each tensor name -> the node that writes it."""
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        """Tensor name -> the nodes that read it (subgraph reads included), in order."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.dependencies()):
                users.setdefault(name, []).append(node)
        return users

    def node(self, name: str) -> Node:
        """The node called ``name``; a ``GraphError`` naming the graph and its nodes if none is."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise GraphError(f"graph {self.name!r} has no node {name!r} "
                         f"(nodes: {[n.name for n in self.nodes][:20]})")

    def sorted_nodes(self) -> list[Node]:
        """The nodes in a valid execution order (re-sorted, so after editing a node in place)."""
        self.nodes = self._sorted(self.nodes)
        self._default_roles = None
        return list(self.nodes)

    def tensor_names(self) -> set[str]:
        """Every tensor the graph knows: inputs, initializers and node outputs."""
        return ({t.name for t in self.inputs} | set(self.initializers)
                | {o for n in self.nodes for o in n.outputs if o})

    def free_names(self) -> set[str]:
        """Tensors read here but defined in no enclosing scope of this graph (for subgraphs)."""
        defined = self.tensor_names()
        return {x for n in self.nodes for x in n.dependencies() if x not in defined}

    def check_operators(self, backends: Sequence[str] = ("numpy",)) -> dict[str, Operator]:
        """Resolve every node (subgraphs too) to an operator; an unknown op is a GraphError."""
        ops = {n.name: make_operator(n, self.opset, backends) for n in self.nodes}
        for node in self.nodes:
            for sub in node.subgraphs():
                sub.check_operators(backends)
        return ops

    # -- editing -------------------------------------------------------------------------
    def _edit(self, nodes: list[Node]) -> None:
        """Adopt ``nodes`` if they form a valid graph; otherwise raise and keep the old ones."""
        names = [n.name for n in nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise GraphError(f"graph {self.name!r}: node name(s) {duplicates} used twice")
        self.nodes = self._sorted(nodes)
        self._default_roles = None

    def _index(self, node: Node | str) -> int:
        name = node.name if isinstance(node, Node) else node
        for i, n in enumerate(self.nodes):
            if n.name == name:
                return i
        raise GraphError(f"graph {self.name!r} has no node {name!r}")

    def insert(self, node: Node, before: Node | str | None = None,
               after: Node | str | None = None) -> None:
        """Add ``node`` (at the end, or next to another node); the graph is re-sorted."""
        if before is not None and after is not None:
            raise GraphError("insert: give `before` or `after`, not both")
        nodes = list(self.nodes)
        node.name = node.name or f"{node.op_type}_{len(nodes)}"
        if before is not None:
            nodes.insert(self._index(before), node)
        elif after is not None:
            nodes.insert(self._index(after) + 1, node)
        else:
            nodes.append(node)
        self._edit(nodes)

    def replace(self, old: Node | str, new: Node | Sequence[Node]) -> None:
        """Put ``new`` (one node or several) where ``old`` was; the graph is re-sorted."""
        i = self._index(old)
        new = [new] if isinstance(new, Node) else list(new)
        for k, node in enumerate(new):
            node.name = node.name or f"{node.op_type}_{len(self.nodes) + k}"
        self._edit(self.nodes[:i] + new + self.nodes[i + 1:])

    def remove(self, *nodes: Node | str) -> None:
        """Remove nodes; an input left without a producer is an error naming its reader."""
        drop = {self.nodes[self._index(n)].name for n in nodes}
        self._edit([n for n in self.nodes if n.name not in drop])

    # -- order ---------------------------------------------------------------------------
    def _sorted(self, nodes: list[Node]) -> list[Node]:
        """Kahn's algorithm; names the node whose input nothing produces, and every clash."""
        available = {t.name for t in self.inputs} | set(self.initializers) | set(self.outer_scope)
        produced_by: dict[str, Node] = {}
        for node in nodes:
            for out in node.outputs:
                if not out:
                    continue
                if out in produced_by:
                    raise GraphError(f"tensor {out!r} is produced by both "
                                     f"{produced_by[out].describe()} and {node.describe()}")
                if out in available and out not in self.initializers:
                    raise GraphError(f"{node.describe()}: output {out!r} has the name of a graph "
                                     f"input")
                produced_by[out] = node
        for node in nodes:
            for name in node.dependencies():
                if name not in available and name not in produced_by:
                    raise GraphError(
                        f"{node.describe()}: input {name!r} is not a graph input, an initializer "
                        f"or the output of any node"
                    )
        order: list[Node] = []
        pending = list(nodes)
        while pending:
            ready = [n for n in pending if all(x in available for x in n.dependencies())]
            if not ready:
                cycle = ", ".join(n.describe() for n in pending[:5])
                raise GraphError(f"graph {self.name!r} has a cycle through {cycle}")
            for node in ready:
                order.append(node)
                available.update(o for o in node.outputs if o)
            ready_ids = {id(n) for n in ready}
            pending = [n for n in pending if id(n) not in ready_ids]
        names = [t.name for t in self.outputs]
        for out in dict.fromkeys(names):
            if names.count(out) > 1:
                raise GraphError(f"graph {self.name!r}: output {out!r} is listed twice")
            if out not in available:
                raise GraphError(f"graph {self.name!r}: output {out!r} is not produced by any "
                                 f"node, nor a graph input or initializer")
        return order

    def nodes_for(self, outputs: Iterable[str], given: Iterable[str] = ()) -> list[Node]:
        """The nodes needed to compute ``outputs`` when the tensors in ``given`` are supplied
        (a fed intermediate cuts off its producer), in execution order."""
        producers = self.producers()
        given = set(given)
        needed: set[str] = set()
        stack = [o for o in outputs if o not in given]
        while stack:
            name = stack.pop()
            node = producers.get(name)
            if node is not None and node.name not in needed:
                needed.add(node.name)
                stack.extend(x for x in node.dependencies() if x not in given)
        return [n for n in self.nodes if n.name in needed]

    def __repr__(self) -> str:
        inputs, outputs = [t.name for t in self.inputs], [t.name for t in self.outputs]
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, {len(self.parameters)} "
                f"parameters, {len(self.state)} state, inputs={inputs}, outputs={outputs})")
