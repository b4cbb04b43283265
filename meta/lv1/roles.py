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
   parameter, or one folded from one of them (unless it holds one repeated number: that was
   made from a parameter's shape, not its values), is a parameter; anything else the exporter
   made (a zero bias for a bias-free convolution, a BUFFER) is a constant, whatever reads it;
5. otherwise: reaching a learnable input (or a subgraph): a parameter; anything else (read
   only as a setting, or not read at all): a constant.

``explain(graph)`` says, per parameter, which rule made it one and through which nodes.
"""

from __future__ import annotations

import fnmatch
import hashlib
from typing import TYPE_CHECKING, Iterable, Iterator, MutableMapping

import numpy as np

from meta.lv0 import UnknownOperatorError

if TYPE_CHECKING:
    from meta.lv1.graph import Graph, Node

PARAMETER, FROZEN, STATE, CONSTANT = "parameter", "frozen", "state", "constant"
ROLES = (PARAMETER, FROZEN, STATE, CONSTANT)


class _Slots:
    """What ``node``'s operator declares about its inputs: state, settings, learnable (``None``:
    every differentiable non-setting input); an operator not registered declares nothing."""

    def __init__(self, node: Node, opset: dict[str, int]) -> None:
        from meta.lv1.graph import GraphError, make_operator

        try:
            op = make_operator(node, opset)
        except (GraphError, UnknownOperatorError):
            op = None
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
    through Transpose", or None), following ``name`` through the static nodes."""
    is_state = False
    stack: list[tuple[str, tuple[str, ...]]] = [(name, ())]
    seen = {name}
    while stack:
        tensor, path = stack.pop()
        for node in consumers.get(tensor, []):
            if tensor not in node.inputs:  # read inside a branch or loop body
                return is_state, f"read by a subgraph of node {node.name!r} ({node.op_type})"
            slot = slots[node.name]
            indices = [i for i, x in enumerate(node.inputs) if x == tensor]
            if not path and any(i in slot.state for i in indices):
                is_state = True
                continue
            if all(o in static for o in node.outputs if o) and node.outputs:
                if any(i not in slot.settings and i not in slot.state for i in indices):
                    for out in node.outputs:
                        if out and out not in seen:
                            seen.add(out)
                            stack.append((out, (*path, node.op_type)))
                continue
            learned = [i for i in indices if slot.learns(i)]
            if learned:
                via = f" through {', '.join(dict.fromkeys(path))}" if path else ""
                where = slot_name(node, learned[0], graph.opset)
                return is_state, f"{node.op_type} {where} of node {node.name!r}{via}"
    return is_state, None


def analyse(graph: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """(every initializer's role by the rules of this module, no user overrides; why each
    parameter is one)."""
    static = _static(graph)
    consumers = graph.consumers()
    slots = {n.name: _Slots(n, graph.opset) for n in graph.nodes}
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
            elif sources and reach and not np.all(value == value.flat[0]):
                # (one repeated number was made from a parameter's shape, not its values: the
                # zero bias of a bias-free convolution is Expand(0, Shape(W)), folded)
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


def default_roles(graph: Graph) -> dict[str, str]:
    """Every initializer's role by the rules of this module (no user overrides)."""
    return analyse(graph)[0]


def explain(graph: Graph) -> dict[str, str]:
    """Parameter name -> why it is one ("reaches Gemm B of node 'fc' through Transpose";
    "chosen by the user" for an override)."""
    reasons = analyse(graph)[1]
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

    def __init__(self, store: dict[str, np.ndarray], names: Iterable[str], kind: str) -> None:
        self._store = store
        self._names = tuple(names)
        self._index = frozenset(self._names)
        self.kind = kind

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

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"a {self.kind} cannot be removed through this view; edit the graph")

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def nbytes(self) -> int:
        return sum(self._store[n].nbytes for n in self._names)

    def __repr__(self) -> str:
        return f"TensorView({self.kind}: {list(self._names)})"


# -- ties -----------------------------------------------------------------------------------
def find_ties(graph: Graph) -> dict[str, tuple[str, str]]:
    """Parameters an exporter wrote twice from one tied PyTorch parameter (a GPT's embedding and
    output head): derived name -> (kept name, "equal" or "transpose"). Two parameters are one
    when their values are equal, or one is the other's transpose; tensors holding one repeated
    number (every LayerNorm's ones) are never taken for a tie. The kept one is the one the
    exporter marked PARAMETER, else the first in the file."""
    roles = graph.roles
    marks = getattr(graph, "exporter_marks", {})
    order = {k: i for i, k in enumerate(graph.initializers)}
    names = sorted((k for k in graph.initializers if roles[k] == PARAMETER),
                   key=lambda k: (marks.get(k) != "PARAMETER", order[k]))
    seen: dict[tuple, list[str]] = {}  # (dtype, shape, digest of the bytes) -> names
    ties: dict[str, tuple[str, str]] = {}

    def key(value: np.ndarray) -> tuple:
        digest = hashlib.blake2b(np.ascontiguousarray(value).tobytes(), digest_size=16)
        return value.dtype.str, value.shape, digest.digest()

    def match(value: np.ndarray) -> str | None:
        return next((k for k in seen.get(key(value), ())
                     if np.array_equal(graph.initializers[k], value)), None)

    for name in names:
        value = graph.initializers[name]
        if value.size < 2 or np.all(value == value.flat[0]):
            continue
        kept = match(value)
        if kept is not None:
            ties[name] = (kept, "equal")
            continue
        if value.ndim == 2:
            kept = match(value.T)
            if kept is not None:
                ties[name] = (kept, "transpose")
                continue
        seen.setdefault(key(value), []).append(name)
    return ties


def tie(graph: Graph) -> dict[str, tuple[str, str]]:
    """Train each tie of ``find_ties`` as one parameter: the derived initializer becomes the
    output of an Identity (or Transpose) of the kept one, so there is one storage, the
    executor sums both gradients into it, and optimizers, checkpoints and strategies see one
    tensor. ``graph.ties`` records it; ``to_onnx`` writes both initializers back."""
    from meta.lv1.graph import Node

    found = {k: v for k, v in find_ties(graph).items()
             if k not in {t.name for t in graph.inputs}}  # an optional feed stays a tensor
    for derived, (kept, kind) in found.items():
        del graph.initializers[derived]
        graph.exporter_marks.pop(derived, None)
        node = Node("Identity" if kind == "equal" else "Transpose", [kept], [derived],
                    f"tie/{derived}", attrs={} if kind == "equal" else {"perm": [1, 0]})
        graph.insert(node)
        graph.ties[derived] = (kept, kind, node.name)
    return found


def tie_note(found: dict[str, tuple[str, str]]) -> str:
    """The one line saying which initializers train as one."""
    pairs = [f"{d} = {k}{'ᵀ' if kind == 'transpose' else ''}" for d, (k, kind) in found.items()]
    shown = "; ".join(pairs[:3]) + (f"; and {len(pairs) - 3} more" if len(pairs) > 3 else "")
    return (f"tied: {shown} train as one parameter (the exporter wrote one tied parameter "
            f"twice); from_onnx(untie=True) keeps them apart")
