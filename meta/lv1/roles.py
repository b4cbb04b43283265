"""What each initializer of a graph is: a trainable parameter, a frozen one, state, or a constant.

An ONNX file does not say which of its initializers are learned. Exporters write weights,
BatchNorm running statistics and plain constants (ReLU6's bounds, an attention scale, a
divisor) alike, so treating every float initializer as a parameter trains constants and
decays statistics. The operators know better, and say so in two declarations
(``meta.lv0.Operator``): ``state_inputs`` (updated by the op in training mode) and
``no_grad_inputs``/``constant_inputs`` (settings, not learned values). From those, by the
rules below, every initializer gets one role; ``Graph.train_only``, ``freeze`` and
``unfreeze`` override the result by name or pattern, as ORT-training's ``requires_grad`` /
``frozen_params`` and PyTorch's ``requires_grad_(False)`` do.

Rules, first match wins:

1. not floating point: a constant (shapes, indices, axes);
2. read by some node at one of its ``state_inputs``: state;
3. read by some node at a differentiable input and of rank >= 1: a parameter. A rank-0 float
   is a constant: exporters write scalars (divisors, scales) as 0-d tensors, while a learned
   scalar is rare (``unfreeze`` makes one trainable);
4. anything else (read only as a setting, or not read at all): a constant.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, MutableMapping

import numpy as np

if TYPE_CHECKING:
    from meta.lv1.graph import Graph, Node

PARAMETER, FROZEN, STATE, CONSTANT = "parameter", "frozen", "state", "constant"
ROLES = (PARAMETER, FROZEN, STATE, CONSTANT)


def _slots(node: Node, operator_of: Callable[[Node], Any]) -> tuple[set[int], set[int]]:
    """(state input indices, non-learned input indices) that ``node``'s operator declares;
    an operator not registered (yet) declares nothing (``operator_of`` gives None)."""
    op = operator_of(node)
    if op is None:
        return set(), set()
    settings = set(getattr(op, "no_grad_inputs", ())) | set(getattr(op, "constant_inputs", ()))
    return set(op.state_inputs), settings


def default_roles(graph: Graph, operator_of: Callable[[Node], Any]) -> dict[str, str]:
    """Every initializer's role by the rules of this module (no user overrides).

    ``operator_of(node)`` is the node's configured operator, or None where none is registered:
    the graph passes its own, so that this module needs nothing from ``graph`` at run time."""
    state: set[str] = set()
    learned: set[str] = set()
    for node in graph.nodes:
        state_slots, settings = _slots(node, operator_of)
        for index, name in enumerate(node.inputs):
            if name in graph.initializers:
                if index in state_slots:
                    state.add(name)
                elif index not in settings:
                    learned.add(name)
        for sub in node.subgraphs():  # what a branch or loop body reads from here
            learned.update(n for n in sub.free_names() if n in graph.initializers)
    roles = {}
    for name, value in graph.initializers.items():
        if not np.issubdtype(value.dtype, np.floating):
            roles[name] = CONSTANT
        elif name in state:
            roles[name] = STATE
        elif name in learned and value.ndim >= 1:
            roles[name] = PARAMETER
        else:
            roles[name] = CONSTANT
    return roles


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
