"""Splitting a graph's layers over ranks by output features (DistBelief's partitioned model,
Megatron-LM's tensor parallelism): which rank holds which neurons, and each rank's graph.

Layers linear in their input's axis 1 (Gemm, Conv) are split in pairs, as Megatron-LM does:

* a **column-parallel** layer takes a replicated input and computes this rank's share of the
  output features (its rows of the weight, its part of the bias); its input passes through
  ``CopyToParallel`` (the gradient of the input is summed over the ranks: one allreduce
  backward, none at all when the input is the data);
* the **row-parallel** layer after it (through elementwise ops, pools and Flatten, which keep
  the split) takes the split input with the matching columns of its weight and produces a
  partial sum, which ``AllReduceSum`` adds up (one allreduce forward); its bias lives on rank
  0 only, so it is added once;
* a **grouped** Conv whose groups fall on the ranks' channels (groups divisible by the ranks)
  needs no communication at all: each rank runs its own groups, on its own channels. This is
  the seed's "local connectivity": a chain of grouped layers between one column-parallel and
  one row-parallel layer costs nothing on the wire.

Only such chains are split (a column-parallel layer whose output reaches, through one reader
at a time, a row-parallel one), so a split tensor never meets an operator that needs all of
it; layers without a partner stay replicated (every rank computes them alike), and any graph
runs. The planner is a pure function of the graph, its tensors' shapes and (rank, ranks):
every rank derives every rank's plan without talking, which is how a rank knows every rank's
shards (``Plan.shards``: gathering the trained model needs them).

Transformers write their linear layers as ``MatMul`` by a (in, out) weight on the last axis
(then ``Add`` of a bias), and attention reshapes that axis into heads. These are split as
Megatron-LM splits a transformer block: a ``MatMul`` layer is **column-parallel** when its
split output reaches row-parallel ``MatMul`` layers through ops that act on the split axis
alone (``_LastAxis``): the bias ``Add`` (the bias split alike), elementwise ops (Gelu), a
``Reshape`` of the features into whole heads and back, ``Transpose``, the batched ``MatMul``
of two tensors split on the same (head) axis, scaling, an additive mask that broadcasts over
the heads, and a ``Softmax`` over another axis. So Q, K and V (one ``CopyToParallel`` of the
LayerNorm output that all three read) and the MLP's first layer are column-parallel, the
attention output projection and the MLP's second layer row-parallel: per block one allreduce
forward and one backward for attention, the same for the MLP. Which layers split is found by
trying: a split tensor that meets any other op (or is a graph output) withdraws the column
layers it came from, and the plan is made again (``plan``).

>>> from meta.lv1 import mlp
>>> graph = mlp(input_shape=(4,), hidden=(6, 6), classes=3)
>>> sample = {"input": np.zeros((2, 4), np.float32), "labels": np.zeros(2, np.int64)}
>>> shapes = probe(graph, sample)
>>> p = plan(graph, shapes, rank=1, ranks=2)
>>> [(n, layer.kind) for n, layer in p.layers.items() if layer.kind != "replicated"]
[('fc0', 'column'), ('relu0', 'split'), ('fc1', 'row')]
>>> p.shards["fc0.weight"][1].indices.tolist(), p.shards["fc1.bias"][1].owner
([3, 4, 5], 0)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from meta.common.component import ComponentError
from meta.lv1.executor import ReferenceExecutor
from meta.lv1.graph import Graph, Node
from meta.lv1.roles import differentiable
from meta.lv3.tensor_parallel import sequence as row_split
from meta.lv3.tensor_parallel.ops import DOMAIN
from meta.lv3.tensor_parallel.parts import Collective, Layer, Plan, Shard

__all__ = ["Collective", "Layer", "Plan", "PlanError", "Shard", "StepShape", "plan", "probe",
           "step_shape"]

Shapes = dict[str, tuple[tuple[int, ...], np.dtype]]  # per example (batch axis left out)

# Operators that act on each element alone: a tensor split on any axis stays split.
ELEMENTWISE = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Softplus", "Softsign", "Gelu",
    "Erf", "HardSigmoid", "HardSwish", "Identity", "Neg", "Abs", "Exp", "Sqrt", "Dropout"})
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div"})

# Operators that act on each feature (channel) of axis 1 alone: a split input stays split.
KEEPS_SPLIT = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Softplus", "Softsign",
    "HardSigmoid", "HardSwish", "Identity", "Neg", "Abs", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Flatten"})


class PlanError(ComponentError):
    """A graph that cannot be partitioned as asked (names the node or tensor)."""


def probe(graph: Graph, sample: dict[str, np.ndarray],
          make_executor: Callable[[Graph], Any] = ReferenceExecutor) -> Shapes:
    """The per-example shape and dtype of every tensor the graph computes, from one run on
    ``sample`` (a few examples) in inference mode."""
    produced = [o for n in graph.nodes for o in n.outputs if o]
    with np.errstate(all="ignore"):
        values = make_executor(graph).eval().inference(sample, produced)
    values = {**{k: v for k, v in sample.items()}, **values}
    return {k: (tuple(np.shape(v)[1:]), np.asarray(v).dtype) for k, v in values.items()
            if np.ndim(v) >= 1}


def _linear(node: Node, graph: Graph, roles: dict[str, str]) -> tuple[str, int, int] | None:
    """(weight, its output-feature axis, its input-feature axis) of a Gemm or Conv that is
    linear in its input's axis 1 with a trainable weight; None for any other node."""
    inits = graph.initializers
    if node.op_type not in ("Gemm", "Conv") or len(node.inputs) < 2 or len(node.outputs) != 1:
        return None
    x, w = node.inputs[0], node.inputs[1]
    if x in inits or w not in inits or roles[w] != "parameter":
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if node.op_type == "Gemm":
        a = node.attrs
        if inits[w].ndim != 2 or a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 \
                or a.get("beta", 1.0) != 1.0:
            return None
        out_axis = 0 if a.get("transB", 0) else 1
    else:
        if inits[w].ndim < 3:
            return None
        out_axis = 0
    width = inits[w].shape[out_axis]
    if bias and (bias not in inits or inits[bias].shape != (width,)):
        return None
    in_axis = 1 if node.op_type == "Conv" else 1 - out_axis
    return w, out_axis, in_axis


def _matmul_weight(node: Node, graph: Graph, roles: dict[str, str],
                   consumers: dict[str, list[Node]]) -> str | None:
    """The (in, out) weight of a ``MatMul`` layer on the last axis (a trainable 2-D
    initializer only this node reads, a computed input), or None."""
    if node.op_type != "MatMul" or len(node.inputs) != 2 or len(node.outputs) != 1:
        return None
    x, w = node.inputs
    inits = graph.initializers
    if x in inits or w not in inits or roles[w] != "parameter" or inits[w].ndim != 2:
        return None
    return w if len(consumers.get(w, [])) == 1 else None


def _column_candidates(graph: Graph, ranks: int) -> set[str]:
    """Every ``MatMul`` layer wide enough to split over ``ranks`` (``plan`` keeps those whose
    split reaches row-parallel layers)."""
    roles, consumers = graph.roles, graph.consumers()
    found = set()
    for node in graph.nodes:
        w = _matmul_weight(node, graph, roles, consumers)
        if w is not None and graph.initializers[w].shape[1] >= ranks:
            found.add(node.name)
    return found


class _Blocked(Exception):
    """A split tensor met an op that needs all of it: the column layers it came from stay
    whole."""

    def __init__(self, origins: set[str], why: str) -> None:
        super().__init__(why)
        self.origins = origins


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _split(n: int, ranks: int) -> list[np.ndarray]:
    return [np.asarray(part, np.int64) for part in np.array_split(np.arange(n), ranks)]


class _Planner:
    """One walk over the nodes in order, tracking which tensors are split along axis 1 and,
    for each rank, which of their features it holds."""

    def __init__(self, graph: Graph, shapes: Shapes, rank: int, ranks: int, group: int,
                 columns: frozenset[str] = frozenset()) -> None:
        self.graph, self.shapes, self.rank, self.ranks, self.group = \
            graph, shapes, rank, ranks, group
        self.columns = columns  # MatMul layers to split by columns (last axis)
        # tensors split on any axis (the MatMul layers' chains): (axis, indices per rank), and
        # the column layers each split came from
        self.split: dict[str, tuple[int, list[np.ndarray]]] = {}
        self.origin: dict[str, set[str]] = {}
        self.copies: dict[str, str] = {}  # replicated tensor -> its CopyToParallel output
        self.constants: dict[str, np.ndarray] = {}
        self.roles = graph.roles
        self.consumers = graph.consumers()
        self.outputs = {t.name for t in graph.outputs}
        self.needs_grad = differentiable(graph)
        self.layout: dict[str, list[np.ndarray]] = {}  # split tensor -> indices per rank
        self.nodes: list[Node] = []
        self.shards: dict[str, list[Shard]] = {}
        self.layers: dict[str, Layer] = {}
        self.collectives: list[Collective] = []

    # -- helpers -------------------------------------------------------------------------
    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(self.shapes[name][1])

    def _elements(self, name: str) -> int:
        return math.prod(self.shapes[name][0])

    def _assign(self, name: str, shards: list[Shard], node: Node) -> None:
        if name in self.shards and (shards[0].split or self.shards[name][0].split):
            readers = [n.name for n in self.consumers.get(name, [])]
            raise PlanError(f"initializer {name!r} is read by nodes {readers}: a split "
                            f"layer's weights must have one reader (node {node.name!r})")
        self.shards[name] = shards

    def _whole(self, node: Node) -> None:
        for x in node.inputs:
            if x in self.graph.initializers:
                self._assign(x, [Shard()] * self.ranks, node)

    def _leads_to_row_layer(self, tensor: str) -> bool:
        """Whether ``tensor``, split, would reach a row-parallel layer through ops that keep
        it split (grouped layers included): then splitting its producer pays."""
        if self.ranks == 1:
            return False
        while True:
            users = self.consumers.get(tensor, [])
            if tensor in self.outputs or len(users) != 1:
                return False
            user = users[0]
            if user.inputs[0] != tensor or tensor in user.inputs[1:]:
                return False
            if _linear(user, self.graph, self.roles) is not None:
                groups = int(user.attrs.get("group", 1))
                if groups == 1:
                    return True
                if groups % self.ranks:
                    return False
            elif not self._keeps_split(user):
                return False
            tensor = user.outputs[0]

    def _keeps_split(self, node: Node) -> bool:
        if node.op_type == "Reshape":  # (N, C) -> (N, C, 1, ...): the features stay on axis 1
            shape = self.graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 \
                else None
            return (shape is not None and shape.ndim == 1 and len(shape) >= 2
                    and shape[:2].tolist() == [0, -1] and bool(np.all(shape[2:] == 1))
                    and not node.attrs.get("allowzero", 0) and node.outputs[0] not in self.outputs)
        return (node.op_type in KEEPS_SPLIT and len([x for x in node.inputs if x]) == 1
                and len([o for o in node.outputs if o]) == 1
                and (node.op_type != "Flatten" or node.attrs.get("axis", 1) == 1)
                and not any(o in self.outputs for o in node.outputs))

    # -- the walk ------------------------------------------------------------------------
    def run(self) -> Plan:
        for node in self.graph.nodes:
            x = node.inputs[0] if node.inputs else ""
            if any(t in self.split for t in node.inputs if t):
                _LastAxis(self, node).plan()
                continue
            if node.name in self.columns:
                self._column_matmul(node)
                continue
            linear = _linear(node, self.graph, self.roles)
            if linear is not None and x in self.layout:
                self._row_or_grouped(node, *linear)
            elif linear is not None and node.attrs.get("group", 1) == 1 \
                    and self._leads_to_row_layer(node.outputs[0]):
                self._column(node, *linear)
            elif x in self.layout and self._keeps_split(node):
                self._keep_split(node)
            else:
                self._replicated(node)
        return Plan(self.rank, self.ranks, self.nodes, self.shards, self.layers,
                    self.collectives, self.constants)

    def _replicated(self, node: Node) -> None:
        split = [x for x in node.inputs if x in self.layout]
        if split:  # _leads_to_row_layer admits no such chain
            raise PlanError(f"node {node.name!r} ({node.op_type}) would read {split} split "
                            f"over the ranks")
        self._whole(node)
        self.nodes.append(dataclasses.replace(node))
        self.layers[node.name] = Layer("replicated")

    def _column(self, node: Node, w: str, out_axis: int, in_axis: int) -> None:
        weight = self.graph.initializers[w]
        width = weight.shape[out_axis]
        if width < self.ranks:
            self._replicated(node)
            return
        parts = _split(width, self.ranks)
        x, inputs = node.inputs[0], list(node.inputs)
        if x in self.needs_grad:  # its gradient is every rank's part summed
            copy = f"{x}@{node.name}.copy"
            self.nodes.append(Node("CopyToParallel", [x], [copy], f"{node.name}/copy", DOMAIN,
                                   {"group": self.group}))
            self.collectives.append(Collective(x, "backward", self._elements(x),
                                               self._dtype(x).itemsize))
            inputs[0] = copy
        self._assign(w, [Shard(out_axis, p) for p in parts], node)
        if len(inputs) > 2 and inputs[2]:
            self._assign(inputs[2], [Shard(0, p) for p in parts], node)
        self.nodes.append(dataclasses.replace(node, inputs=inputs))
        self.layout[node.outputs[0]] = parts
        self.layers[node.name] = Layer("column", len(parts[self.rank]) / width)

    def _copy(self, x: str) -> str:
        """``x`` through one ``CopyToParallel`` (shared by every column layer reading it: Q, K
        and V of one attention), or ``x`` itself when no gradient flows back into it."""
        if x not in self.needs_grad:
            return x
        if x not in self.copies:
            self.copies[x] = f"{x}@copy"
            self.nodes.append(Node("CopyToParallel", [x], [self.copies[x]], f"{x}/copy",
                                   DOMAIN, {"group": self.group}))
            self.collectives.append(Collective(x, "backward", self._elements(x),
                                               self._dtype(x).itemsize))
        return self.copies[x]

    def _column_matmul(self, node: Node) -> None:
        """``x @ W`` with this rank's columns of ``W``: its features of the output."""
        x, w = node.inputs
        width = self.graph.initializers[w].shape[1]
        parts = _split(width, self.ranks)
        self._assign(w, [Shard(1, p) for p in parts], node)
        self.nodes.append(dataclasses.replace(node, inputs=[self._copy(x), w]))
        y = node.outputs[0]
        self.split[y] = (len(self.shapes[y][0]), parts)  # the last axis (batch included)
        self.origin[y] = {node.name}
        self.layers[node.name] = Layer("column", len(parts[self.rank]) / width)

    def _row_matmul(self, node: Node, parts: list[np.ndarray]) -> None:
        """``x @ W`` with ``x`` split on its last axis: this rank's rows of ``W`` make a
        partial sum, ``AllReduceSum`` the whole output (replicated from here on)."""
        x, w = node.inputs
        self._assign(w, [Shard(0, p) for p in parts], node)
        y = node.outputs[0]
        partial = f"{y}@partial"
        self.nodes.append(dataclasses.replace(node, outputs=[partial]))
        self.nodes.append(Node("AllReduceSum", [partial], [y], f"{node.name}/allreduce",
                               DOMAIN, {"group": self.group}))
        self.collectives.append(Collective(y, "forward", self._elements(y),
                                           self._dtype(y).itemsize))
        self.layers[node.name] = Layer("row", len(parts[self.rank])
                                       / self.graph.initializers[w].shape[0])

    def _row_or_grouped(self, node: Node, w: str, out_axis: int, in_axis: int) -> None:
        x = node.inputs[0]
        parts = self.layout[x]
        weight = self.graph.initializers[w]
        groups = int(node.attrs.get("group", 1))
        inputs = list(node.inputs)
        bias = inputs[2] if len(inputs) > 2 and inputs[2] else ""
        if groups == 1:
            self._assign(w, [Shard(in_axis, p) for p in parts], node)
            if bias:
                self._assign(bias, [Shard(owner=0)] * self.ranks, node)
                if self.rank != 0:
                    inputs = inputs[:2]
            y = node.outputs[0]
            partial = f"{y}@partial"
            self.nodes.append(dataclasses.replace(node, inputs=inputs, outputs=[partial]))
            self.nodes.append(Node("AllReduceSum", [partial], [y], f"{node.name}/allreduce",
                                   DOMAIN, {"group": self.group}))
            self.collectives.append(Collective(y, "forward", self._elements(y),
                                               self._dtype(y).itemsize))
            self.layers[node.name] = Layer("row", len(parts[self.rank]) / weight.shape[in_axis])
            return
        # grouped, groups divisible by the ranks (_leads_to_row_layer): each rank's channels,
        # an even split of the column layer's output, are whole groups, its own
        out = weight.shape[0]
        outs = _split(out, self.ranks)
        self._assign(w, [Shard(0, p) for p in outs], node)
        if bias:
            self._assign(bias, [Shard(0, p) for p in outs], node)
        attrs = {**node.attrs, "group": groups // self.ranks}
        self.nodes.append(dataclasses.replace(node, attrs=attrs))
        self.layout[node.outputs[0]] = outs
        self.layers[node.name] = Layer("grouped", 1 / self.ranks)

    def _keep_split(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        parts = self.layout[x]
        if node.op_type == "Flatten":  # (C, *spatial) -> C * spatial: channel c's block
            size = math.prod(self.shapes[x][0][1:])
            parts = [(p[:, None] * size + np.arange(size)).ravel() for p in parts]
        self._whole(node)
        self.nodes.append(dataclasses.replace(node))
        self.layout[y] = parts
        self.layers[node.name] = Layer("split", len(parts[self.rank])
                                       / sum(len(p) for p in parts))


class _LastAxis:
    """How one node that reads a tensor split on some axis (a MatMul layer's chain) runs on
    this rank, or ``_Blocked`` when it would need all of it."""

    def __init__(self, planner: _Planner, node: Node) -> None:
        self.p, self.node = planner, node
        self.inputs = list(node.inputs)  # as this rank runs it
        self.origins: set[str] = set()
        for t in node.inputs:
            self.origins |= planner.origin.get(t, set())

    def block(self, why: str) -> _Blocked:
        return _Blocked(self.origins, f"node {self.node.name!r} ({self.node.op_type}): {why}")

    def rank_of(self, name: str) -> int:
        """Dimensions of ``name`` (the batch axis included for computed tensors)."""
        inits = self.p.graph.initializers
        return inits[name].ndim if name in inits else len(self.p.shapes[name][0]) + 1

    def plan(self) -> None:
        p, node = self.p, self.node
        op = node.op_type
        split = {t: p.split[t] for t in node.inputs if t in p.split}
        x = node.inputs[0]
        if op == "MatMul":
            out = self._matmul(split)
        elif op in ELEMENTWISE and x in split and len(split) == 1:
            out = split[x]
        elif op in BROADCASTING:
            out = self._broadcast(split)
        elif op == "Transpose" and x in split:
            axis, parts = split[x]
            perm = list(node.attrs.get("perm", range(self.rank_of(x))[::-1]))
            out = (perm.index(axis), parts)
        elif op in ("Softmax", "LogSoftmax") and x in split:
            axis, parts = split[x]
            along = int(node.attrs.get("axis", -1)) % self.rank_of(x)
            if along == axis:
                raise self.block("normalises over the split axis")
            out = (axis, parts)
        elif op == "Reshape" and x in split and len(split) == 1:
            out = self._reshape(split[x])
        else:
            raise self.block(f"reads {sorted(split)} split over the ranks")
        if out is None:  # a row-parallel MatMul: its output is whole
            return
        for t in node.outputs:
            if t in p.outputs:
                raise self.block(f"graph output {t!r} would be split over the ranks")
        y = node.outputs[0]
        p.split[y], p.origin[y] = out, self.origins
        inits = p.graph.initializers
        for t in self.inputs:  # what the rules did not split is whole (a dropout's ratio)
            if t in inits and t not in p.shards:
                p._assign(t, [Shard()] * p.ranks, node)
        p.nodes.append(dataclasses.replace(node, inputs=self.inputs, attrs=dict(node.attrs)))
        axis, parts = out
        p.layers[node.name] = Layer("split", len(parts[p.rank]) / sum(len(q) for q in parts))

    def _matmul(self, split: dict) -> tuple[int, list[np.ndarray]] | None:
        p, node = self.p, self.node
        a, b = node.inputs
        w = _matmul_weight(node, p.graph, p.roles, p.consumers)
        if w is not None and a in split and split[a][0] == self.rank_of(a) - 1:
            parts = split[a][1]
            if sum(len(q) for q in parts) != p.graph.initializers[w].shape[0]:
                raise self.block(f"weight {w!r} does not match the split features")
            p._row_matmul(node, parts)
            return None
        if a in split and b in split and split[a][0] == split[b][0] \
                and _same(split[a][1], split[b][1]) \
                and self.rank_of(a) == self.rank_of(b) and split[a][0] < self.rank_of(a) - 2:
            return split[a]  # a batched product: each rank its own heads
        raise self.block("a matrix product over the split axis")

    def _broadcast(self, split: dict) -> tuple[int, list[np.ndarray]]:
        p, node = self.p, self.node
        y = node.outputs[0]
        ny = self.rank_of(y)
        found = None
        for t in split:  # every split operand: the same axis of the output, the same parts
            axis, parts = split[t]
            axis += ny - self.rank_of(t)
            if found is not None and (found[0] != axis or not _same(found[1], parts)):
                raise self.block("operands split differently")
            found = (axis, parts)
        axis, parts = found
        inits = p.graph.initializers
        for t in node.inputs:
            if t in split or not t:
                continue
            at = axis - (ny - self.rank_of(t))
            size = inits[t].shape[at] if t in inits and at >= 0 else None
            if at < 0 or size == 1:
                continue
            full = sum(len(q) for q in parts)
            if t in inits and size == full and inits[t].ndim == 1 and node.op_type == "Add" \
                    and p.roles[t] == "parameter":
                try:  # a column layer's bias: split alike
                    p._assign(t, [Shard(0, q) for q in parts], node)
                except PlanError as err:
                    raise self.block(str(err)) from err
                continue
            raise self.block(f"operand {t!r} is whole along the split axis")
        return found

    def _reshape(self, split: tuple[int, list[np.ndarray]]) -> tuple[int, list[np.ndarray]]:
        """Features into whole heads ((..., C) -> (..., H, d)) or heads back into features,
        with this rank's own shape constant."""
        p, node = self.p, self.node
        x, shape_name = node.inputs[0], node.inputs[1]
        axis, parts = split
        given = p.graph.initializers.get(shape_name)
        y = node.outputs[0]
        before = (0, *p.shapes[x][0])  # the batch axis: whatever it is
        after = (0, *p.shapes[y][0])
        if given is None or node.attrs.get("allowzero", 0) or before[:axis] != after[:axis]:
            raise self.block("a reshape that moves the split axis")
        if len(after) == len(before) + 1 and after[axis] * after[axis + 1] == before[axis] \
                and before[axis + 1:] == after[axis + 2:]:
            block = after[axis + 1]  # split: whole blocks of ``block`` features (heads)
            new = []
            for q in parts:
                heads = np.unique(q // block)
                if not np.array_equal(q, (heads[:, None] * block + np.arange(block)).ravel()):
                    raise self.block(f"the ranks' features are not whole heads of {block}")
                new.append(heads.astype(np.int64))
        elif len(after) == len(before) - 1 and after[axis] == before[axis] * before[axis + 1] \
                and before[axis + 2:] == after[axis + 1:]:
            block = before[axis + 1]  # merge: each head's features
            new = [(q[:, None] * block + np.arange(block)).ravel().astype(np.int64)
                   for q in parts]
        else:
            raise self.block("a reshape that moves the split axis")
        local = np.asarray(given).copy()
        if -1 in local[axis:].tolist() or 0 in local[axis:].tolist():
            local[axis:] = after[axis:]
        local[axis] = len(new[p.rank])
        name = f"{node.name}.shape@part"
        p.constants[name] = local.astype(np.asarray(given).dtype)
        self.inputs = [x, name]
        return axis, new


def plan(graph: Graph, shapes: Shapes, rank: int, ranks: int, group: int = 0,
         sequence: bool = False) -> Plan:
    """Rank ``rank``'s part of ``graph`` split over ``ranks`` (``shapes``: ``probe``'s);
    ``group`` names the communicator its collectives use (``tensor_parallel_ops.bind``).
    ``sequence``: the part every rank would repeat split by rows where the graph allows it
    (``sequence``: Megatron-LM's sequence parallelism)."""
    made = _tensor_parallel(graph, shapes, rank, ranks, group)
    if sequence and ranks > 1:
        return row_split.apply(made, graph, shapes, group) or made
    return made


def _tensor_parallel(graph: Graph, shapes: Shapes, rank: int, ranks: int, group: int
                     ) -> Plan:
    if not 0 <= rank < ranks:
        raise PlanError(f"rank {rank} is not one of {ranks} partitions")
    missing = [n.outputs[0] for n in graph.nodes if n.outputs and n.outputs[0]
               and n.outputs[0] not in shapes and _linear(n, graph, graph.roles)]
    if missing:
        raise PlanError(f"no shapes for tensors {missing[:5]}: probe the graph first")
    columns = _column_candidates(graph, ranks) if ranks > 1 else set()
    while True:
        try:
            return _Planner(graph, shapes, rank, ranks, group, frozenset(columns)).run()
        except _Blocked as blocked:
            if not blocked.origins & columns:  # cannot happen: every split has an origin
                raise PlanError(str(blocked)) from blocked
            columns -= blocked.origins


@dataclass(frozen=True)
class StepShape:
    """What a partitioned step at ``ranks`` ranks does, for a model of its time (``meta
    plan``'s ``tensor_parallel_costs``, the strategy's ``predicted``): per node the share of
    its work the busiest rank runs (rank 0: it takes the first of uneven splits and the
    row-parallel biases), the bytes per example of each allreduce one step makes, and for each
    the nodes whose work can hide it."""

    ranks: int
    """The ranks the graph is split over."""
    shares: dict[str, float]
    """node -> the fraction of its work rank 0 does (1.0: replicated)."""
    allreduce_bytes: tuple[int, ...]
    """Per allreduce of a step (forward and backward), its buffer's bytes per example."""
    phases: tuple[str, ...] = ()
    """Per allreduce, "forward" or "backward"."""
    overlapped: tuple[tuple[str, ...], ...] = ()
    """Per allreduce, the nodes whose weight gradients the planned executor computes while
    it travels (a backward allreduce: the column-parallel layers that read its copy; the
    plan's scheduler, ``meta.lv1.plan.overlap``, moves them between its start and its wait);
    empty for a forward one (everything after it reads its sum)."""
    held_fraction: float = 1.0
    """Rank 0's parameter bytes over the whole graph's: the share of the update it runs."""
    kinds: tuple[str, ...] = ()
    """Per collective, allreduce, reduce_scatter or allgather (sequence parallelism: each
    moves the bytes of half a ring allreduce)."""
    fixed_bytes: tuple[int, ...] = ()
    """Per collective, bytes that do not grow with the batch (a loss's sums, the gradients
    of the parameters the row-split part reads)."""

    def volumes(self, batch: int) -> list[tuple[float, bool]]:
        """Per collective of a step of ``batch`` examples: (its buffer's bytes, whether it
        is half a ring allreduce: a reduce-scatter or an all-gather moves one of the ring's
        two passes). What ``waited`` times and ``meta plan`` counts as bytes sent."""
        return [(per_example * batch + (self.fixed_bytes[i] if i < len(self.fixed_bytes)
                                        else 0),
                 i < len(self.kinds) and self.kinds[i] != "allreduce")
                for i, per_example in enumerate(self.allreduce_bytes)]

    def waited(self, batch: int, transfer: Callable[[float], float],
               floor: Callable[[float], float], cover: Callable[[str], float]
               ) -> tuple[float, float]:
        """(seconds a step of ``batch`` examples spends in its allreduces, seconds the
        overlap hides), given ``transfer`` (bytes -> an allreduce's seconds), ``floor`` (bytes
        -> what an overlapped one costs at least: its bandwidth term without a progress
        thread, since MPI then moves it inside the tests, on the rank's own core) and
        ``cover`` (node -> its weight gradient's seconds on this rank). A forward allreduce
        is waited for whole; a backward one for what the weight gradients of ``overlapped``
        do not cover, never less than ``floor``. The one rule ``meta plan`` and the
        strategy's report both apply."""
        total = hidden = 0.0
        for i, (v, half) in enumerate(self.volumes(batch)):
            t = transfer(v) / 2 if half else transfer(v)  # half a ring: one of its passes
            nodes = self.overlapped[i] if i < len(self.overlapped) else ()
            if nodes:
                least = floor(v) / 2 if half else floor(v)
                exposed = min(t, max(t - sum(cover(n) for n in nodes), least))
                hidden += t - exposed
                t = exposed
            total += t
        return total, hidden


def step_shape(graph: Graph, shapes: Shapes, ranks: int, sequence: bool = True) -> StepShape:
    """The ``StepShape`` of ``graph`` split over ``ranks`` (``shapes``: ``probe``'s): the same
    plan the strategy makes (``sequence``: with sequence parallelism, the strategy's default),
    so the model splits exactly the nodes a run splits. A graph output's gather (run only
    when it is asked for) is left out."""
    mine = plan(graph, shapes, 0, ranks, sequence=sequence)
    readers: dict[str, list[str]] = {}
    for node in mine.nodes:
        for x in node.inputs:
            readers.setdefault(x, []).append(node.name)
    # each backward allreduce (reduce-scatter) of a CopyToParallel (GatherRows) runs beside
    # the weight gradients of the column layers reading its output
    copied: dict[str, tuple[str, ...]] = {}
    for n in mine.nodes:
        if n.domain == DOMAIN and (n.op_type == "CopyToParallel" or (
                n.op_type == "GatherRows" and n.attrs.get("reduce", 1))):
            copied[n.inputs[0].removesuffix("@rows")] = tuple(readers.get(n.outputs[0], ()))
    kept = [c for c in mine.collectives if c.phase != "output"]
    overlapped = tuple(copied.get(c.tensor, ()) if c.phase == "backward"
                       and c.kind != "allgather" else () for c in kept)
    total = graph.parameters.nbytes()
    return StepShape(ranks, {n: layer.share for n, layer in mine.layers.items()},
                     tuple(c.elements * c.itemsize for c in kept),
                     tuple(c.phase for c in kept), overlapped,
                     mine.bytes_of(graph) / total if total else 1.0,
                     tuple(c.kind for c in kept), tuple(c.fixed for c in kept))
