"""What each initializer of a graph is: a trainable parameter, a frozen one, state, or a constant.

An ONNX file does not say which of its initializers are learned. Exporters write weights,
BatchNorm running statistics and plain constants (ReLU6's bounds, an attention scale, a
divisor) alike, and an exporter's graph optimizer writes parameters it transformed (a Linear's
W^T, LSTM packed weights, a position embedding gathered by a constant index) as new
initializers. So roles follow the computation: the operators say which of their inputs hold
learned values (``meta.lv0.Operator.learnable_inputs``), which are updated state
(``state_inputs``) and which are settings (``no_grad_inputs``/``constant_inputs``), and an
initializer is a parameter when it *reaches* a learnable input, directly or through nodes
that compute from initializers only (a Transpose, Reshape, Concat, Gather by a constant
index, a Cast, a Mul by a constant: the exporter's weight transforms, whose result is the
same for every batch). ``Graph.train_only``, ``freeze`` and ``unfreeze`` override the result
by name or pattern, as ORT-training's ``requires_grad`` / ``frozen_params`` and PyTorch's
``requires_grad_(False)`` do.

Rules, first match wins:

1. not floating point: a constant (shapes, indices, axes, boolean masks);
2. read by some node at one of its ``state_inputs``: state;
3. rank 0: a constant. Exporters write scalars (divisors, scales) as 0-d tensors, while a
   learned scalar is rare (``unfreeze`` makes one trainable);
4. where the file says where its initializers come from (PyTorch's dynamo exporter marks
   each one PARAMETER or BUFFER, lists its parameters in a graph signature, and its
   optimizer records what it folded a new initializer from): a PARAMETER, a signature
   parameter, or one folded from one of them (unless it holds one repeated number while its
   source is still in the file: that was made from a parameter's shape, not its values), is a
   parameter; anything else the exporter
   made (a zero bias for a bias-free convolution, a BUFFER) is a constant, whatever reads it;
5. otherwise: reaching a learnable input (or a subgraph): a parameter; anything else (read
   only as a setting, or not read at all): a constant.

``explain(graph)`` says, per parameter, which rule made it one and through which nodes.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, MutableMapping

import numpy as np

from meta.lv0 import UnknownOperatorError

if TYPE_CHECKING:
    from meta.lv1.graph import Graph, Node

PARAMETER, FROZEN, STATE, CONSTANT = "parameter", "frozen", "state", "constant"
ROLES = (PARAMETER, FROZEN, STATE, CONSTANT)


class _Slots:
    """What a node's operator ``op`` declares about its inputs: state, settings, learnable
    (``None``: every differentiable non-setting input); ``op`` None (an operator not registered
    yet) declares nothing."""

    def __init__(self, op: Any) -> None:
        self.state = set(getattr(op, "state_inputs", ()))
        self.settings = set(getattr(op, "no_grad_inputs", ())) | \
            set(getattr(op, "constant_inputs", ()))
        learnable = getattr(op, "learnable_inputs", None)
        self.learnable = None if learnable is None else set(learnable)

    def learns(self, index: int) -> bool:
        if index in self.state or index in self.settings:
            return False
        return self.learnable is None or index in self.learnable


def slot_name(node: Node, index: int, opset: dict[str, int]) -> str:
    """The ONNX schema's name of input ``index`` of ``node`` (Gemm 1 -> "B"), for messages."""
    import onnx

    try:
        schema = onnx.defs.get_schema(node.op_type, opset.get(node.domain, opset.get("", 1)),
                                      node.domain)
        formals = schema.inputs
        return formals[min(index, len(formals) - 1)].name
    except Exception:  # not an ONNX op, or a version the installed onnx does not know
        return f"input {index}"


def _static(graph: Graph) -> set[str]:
    """Tensors computed from initializers and constants alone: the same for every batch."""
    static = set(graph.initializers)
    for node in graph.nodes:
        if not any(True for _ in node.subgraphs()) and all(x in static for x in node.inputs
                                                            if x):
            static.update(o for o in node.outputs if o)
    return static


def _reach(graph: Graph, name: str, static: set[str], consumers: dict[str, list[Node]],
           slots: dict[str, _Slots]) -> tuple[bool, str | None]:
    """(read at a state input, where it reaches a learnable input: "Gemm B of node 'fc'
    through Transpose", or None), following ``name`` through the static nodes. A graph that
    computes from initializers alone (no fed input: everything is static) still learns where
    its initializer is read at a learnable input on the way to one of the graph's outputs."""
    is_state = False
    outputs = {t.name for t in graph.outputs}
    stack: list[tuple[str, tuple[str, ...], str | None]] = [(name, (), None)]
    seen = {name}
    while stack:
        tensor, path, passed = stack.pop()
        if passed and tensor in outputs:
            return is_state, passed
        for node in consumers.get(tensor, []):
            if tensor not in node.inputs:  # read inside a branch or loop body
                return is_state, f"read by a subgraph of node {node.name!r} ({node.op_type})"
            slot = slots[node.name]
            indices = [i for i, x in enumerate(node.inputs) if x == tensor]
            if not path and any(i in slot.state for i in indices):
                is_state = True
                continue
            learned = [i for i in indices if slot.learns(i)]
            via = f" through {', '.join(dict.fromkeys(path))}" if path else ""
            where = (f"{node.op_type} {slot_name(node, learned[0], graph.opset)} of node "
                     f"{node.name!r}{via}") if learned else None
            if all(o in static for o in node.outputs if o) and node.outputs:
                if any(i not in slot.settings and i not in slot.state for i in indices):
                    for out in node.outputs:
                        if out and out not in seen:
                            seen.add(out)
                            stack.append((out, (*path, node.op_type), passed or where))
                continue
            if where:
                return is_state, where
    return is_state, None


def analyse(graph: Graph, operator_of: Callable[[Node], Any]
            ) -> tuple[dict[str, str], dict[str, str]]:
    """(every initializer's role by the rules of this module, no user overrides; why each
    parameter is one). ``operator_of(node)`` is the node's configured operator, or None where
    none is registered: the graph passes its own, so this module needs nothing from
    ``meta.lv1.graph`` at run time."""
    static = _static(graph)
    consumers = graph.consumers()
    slots = {n.name: _Slots(operator_of(n)) for n in graph.nodes}
    marks = getattr(graph, "exporter_marks", {})
    folded = getattr(graph, "folded_from", {})
    signature = getattr(graph, "signature_parameters", set())
    marked = any(marks.get(k) == "PARAMETER" for k in graph.initializers)
    known = {k for k in graph.initializers if marks.get(k) == "PARAMETER"} | set(signature)
    roles: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for name, value in graph.initializers.items():
        if not np.issubdtype(value.dtype, np.floating):
            roles[name] = CONSTANT
            continue
        is_state, reach = _reach(graph, name, static, consumers, slots)
        if is_state:
            roles[name] = STATE
            continue
        roles[name] = CONSTANT
        if value.ndim == 0:
            continue
        reaches = f"; reaches {reach}" if reach else ""
        if marked:
            sources = [s for s in folded.get(name, ()) if s in known]
            if marks.get(name) == "PARAMETER":
                reasons[name] = f"marked PARAMETER by the exporter{reaches}"
            elif name in signature and marks.get(name) is None:
                reasons[name] = f"a parameter in the exporter's graph signature{reaches}"
            elif sources and reach and (not np.all(value == value.flat[0]) or
                                        any(s not in graph.initializers for s in sources)):
                # (one repeated number was made from a parameter's shape, not its values: the
                # zero bias of a bias-free convolution is Expand(0, Shape(W)), folded; unless
                # the parameter itself is gone from the file, its values kept only here)
                reasons[name] = (f"the exporter's optimizer made it from {', '.join(sources)}"
                                 f"{reaches}")
            else:
                continue
        elif reach:
            reasons[name] = f"reaches {reach}"
        else:
            continue
        roles[name] = PARAMETER
    return roles, reasons


def default_roles(graph: Graph, operator_of: Callable[[Node], Any]) -> dict[str, str]:
    """Every initializer's role by the rules of this module (no user overrides)."""
    return analyse(graph, operator_of)[0]


def explain(graph: Graph) -> dict[str, str]:
    """Parameter name -> why it is one ("reaches Gemm B of node 'fc' through Transpose";
    "chosen by the user" for an override)."""
    reasons = analyse(graph, graph.declared_operator)[1]
    chosen = "chosen by the user (unfreeze / trainable=)"
    return {name: chosen if graph.role_overrides.get(name) == PARAMETER
            else reasons.get(name, chosen)
            for name, role in graph.roles.items() if role == PARAMETER}


def matching(names: Iterable[str], patterns: Iterable[str], what: str) -> list[str]:
    """The names matching any of the shell-style ``patterns`` (``conv1.*``); a pattern that
    matches nothing is an error naming it, so a typo does not silently train everything."""
    names = list(names)
    found: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            near = [n for n in names if pattern.split("*")[0].split("?")[0] in n][:5] or names[:5]
            raise KeyError(f"{what}: pattern {pattern!r} matches no initializer "
                           f"(some names: {near})")
        found.extend(h for h in hits if h not in found)
    return found


class TensorView(MutableMapping[str, np.ndarray]):
    """Some of a graph's initializers by name, reading and writing the graph's own dict.

    ``graph.parameters`` is one: an optimizer updating its arrays in place updates the network,
    and a Level 3 strategy that moves them into a flat buffer (``FlatBuffer.adopt`` assigns the
    buffer's views) re-points the graph itself, so no caller has to. The names are fixed when
    the view is made: freezing later does not change an optimizer's set.
    """

    def __init__(self, store: dict[str, np.ndarray], names: Iterable[str], kind: str,
                 on_change: Callable[[], None] | None = None) -> None:
        self._store = store
        self._names = tuple(names)
        self._index = frozenset(self._names)
        self.kind = kind
        self._on_change = on_change  # the graph's touch: its version stamp moves on

    def touch(self) -> None:
        """Say these arrays' values changed (an optimizer's in-place step): the graph's
        version stamp moves on, so planned executors re-read the weights."""
        if self._on_change is not None:
            self._on_change()

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._index:
            raise KeyError(f"{name!r} is not a {self.kind} of this graph")
        return self._store[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if name not in self._index:
            raise KeyError(f"{name!r} is not a {self.kind} of this graph")
        current = self._store[name]
        if np.shape(value) != current.shape:
            raise ValueError(f"{self.kind} {name!r}: shape {np.shape(value)} does not fit "
                             f"{current.shape}")
        self._store[name] = value
        self.touch()

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"a {self.kind} cannot be removed through this view; edit the graph")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def nbytes(self) -> int:
        """The bytes of the arrays in the view."""
        return sum(self._store[n].nbytes for n in self._names)

    def __repr__(self) -> str:
        return f"TensorView({self.kind}: {list(self._names)})"


def differentiable(graph: Graph) -> set[str]:
    """Tensors that depend on a trainable parameter: those whose gradient must flow back."""
    roles = graph.roles
    live = {k for k, r in roles.items() if r == "parameter"}
    for node in graph.nodes:
        if any(x in live for x in node.dependencies()):
            live.update(o for o in node.outputs if o)
    return live
