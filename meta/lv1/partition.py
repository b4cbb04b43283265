"""Cutting a graph into consecutive stages (GPipe's partitions, PipeDream's stages).

A graph operation of Level 1: the pipeline (Level 3) cuts a model into stages with it, ZeRO-3
into layer groups, and the planned executor's activation recomputation into segments.

A stage is a run of consecutive nodes of the graph's topological order, so every stage reads
only what earlier stages (or the data) produced. ``partition`` cuts after the nodes the user
names, or balances a per-node cost: the stages' largest total is made as small as possible
(dynamic programming over prefix sums). Costs (``node_costs``) are measured node times
(forward + backward, from the executor's profile), a FLOP estimate, or parameter counts.

What crosses a cut is derived, not declared: a tensor produced in stage ``a`` and last read in
stage ``b > a`` (graph outputs count as read by the last stage) is sent at every boundary in
between, so a skip connection over a stage is relayed through it, and its gradient is summed
there with the relaying stage's own. Graph inputs (the images, the labels) are not sent: every
rank holds the batch and each stage feeds the inputs it reads. A node of weights alone (a
``Constant`` causal mask, the Transpose of a tied embedding) is not sent either: every stage
that reads it computes it.

A parameter read in two stages (a language model's output head tied to its token embedding)
is refused unless the caller sums its gradients over the stages that hold it (``tied=True``:
the pipeline does); ``Partition.tied`` names those parameters and their stages.

>>> from meta.lv1 import mlp
>>> part = partition(mlp(hidden=[8, 8]), 2, cuts=["relu0"])
>>> [s.nodes for s in part.stages]
[['flatten', 'fc0', 'relu0'], ['fc1', 'relu1', 'logits', 'loss']]
>>> part.stages[0].sends, part.stages[1].receives, part.stages[1].feeds
(['relu0'], ['relu0'], ['labels'])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from meta.common.component import ComponentError
from meta.lv1.graph import Graph, TensorInfo

BALANCES = ("measured", "flops", "params")


class PartitionError(ComponentError):
    """Cut points or a stage count that cannot make a pipeline of this graph (named)."""


@dataclass
class Stage:
    """One stage: its nodes (in order), what it receives from the previous stage and sends to
    the next (activations, in an order every rank agrees on), the graph inputs it feeds from
    the batch, the initializers it reads and its cost under the partition's cost model."""

    index: int
    """Its position in the pipeline (the rank that runs it)."""
    nodes: list[str]
    """Its graph nodes' names, in order."""
    receives: list[str] = field(default_factory=list)
    """Tensors it receives from the previous stage (activations), in the order both sides use."""
    sends: list[str] = field(default_factory=list)
    """Tensors it sends to the next stage, in the order both sides use."""
    feeds: list[str] = field(default_factory=list)
    """Graph inputs it reads from the batch."""
    initializers: list[str] = field(default_factory=list)
    """Initializers (parameters, constants) its nodes read."""
    cost: float = 0.0
    """Its cost under the partition's cost model (seconds, or a size where not measured)."""


@dataclass
class Partition:
    """Stages of ``graph``, and the graph outputs the last stage computes."""

    stages: list[Stage]
    """The stages, first to last."""
    outputs: list[str]
    """The whole graph's outputs the last stage produces."""
    balance: str = "cuts"
    """how the cuts were chosen: "cuts" (the user's) or a cost model"""
    tied: dict[str, list[int]] = field(default_factory=dict)
    """parameter -> stages reading it"""

    @property
    def cuts(self) -> list[str]:
        """The last node of every stage but the last (what ``partition(cuts=...)`` takes)."""
        return [s.nodes[-1] for s in self.stages[:-1]]

    def stage_graph(self, graph: Graph, index: int) -> Graph:
        """Stage ``index`` as a graph of its own: inputs are the activations it receives and
        the graph inputs it feeds, outputs what it sends (the last stage: the graph outputs).
        Initializers are the graph's own arrays (shared, not copied) with their roles."""
        stage = self.stages[index]
        declared = {t.name: t for t in graph.inputs}
        infos = {t.name: t for t in graph.outputs}
        inputs = [TensorInfo(t, None, None) for t in stage.receives] + [
            declared[t] for t in stage.feeds]
        names = self.outputs if index == len(self.stages) - 1 else stage.sends
        outputs = [infos.get(t, TensorInfo(t, None, None)) for t in names]
        nodes = [dataclasses.replace(graph.node(n)) for n in stage.nodes]
        sub = Graph(nodes, inputs, outputs,
                    {k: graph.initializers[k] for k in stage.initializers}, graph.opset,
                    f"{graph.name}.stage{index}",
                    {k: v for k, v in graph.value_info.items() if k not in stage.receives})
        roles = graph.roles
        sub.role_overrides = {k: roles[k] for k in stage.initializers}
        return sub

    def describe(self, graph: Graph | None = None) -> str:
        """One line per stage: nodes, cost, parameters, what it receives and sends."""
        lines = []
        for s in self.stages:
            nodes = s.nodes if len(s.nodes) <= 6 else [*s.nodes[:3], "...", *s.nodes[-2:]]
            params = ""
            if graph is not None:
                roles = graph.roles
                count = sum(graph.initializers[k].size for k in s.initializers
                            if roles[k] == "parameter")
                params = f", {count} parameters"
            lines.append(f"stage {s.index}: {len(s.nodes)} nodes [{', '.join(nodes)}], cost "
                         f"{s.cost:.3g}{params}; receives {s.receives or '-'}, sends "
                         f"{s.sends or '-'}")
        return "\n".join(lines)


def _cost_total(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    return [float(sum(costs[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]


def balanced_bounds(costs: Sequence[float], stages: int) -> list[int]:
    """Bounds ``[0, b1, ..., n]`` of ``stages`` non-empty consecutive runs of ``costs`` whose
    largest sum is the smallest possible; among those, the most even (smallest sum of squared
    stage costs), so free nodes do not make a stage of their own.

    >>> balanced_bounds([4, 1, 1, 1, 1], 2)
    [0, 1, 5]
    >>> balanced_bounds([0, 2, 0, 1, 0, 1], 3)
    [0, 2, 4, 6]
    """
    n = len(costs)
    if not 1 <= stages <= n:
        raise PartitionError(f"cannot cut {n} nodes into {stages} non-empty stages")
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=np.float64))])
    slack = 1e-9 * max(float(prefix[-1]), 1e-300)  # sums equal up to rounding are ties
    # worst[k][j], squares[k][j]: the best (largest stage, sum of squares) when the first j
    # nodes form k stages; choice[k][j]: where the k-th stage starts then
    worst = np.full((stages + 1, n + 1), np.inf)
    squares = np.full((stages + 1, n + 1), np.inf)
    choice = np.zeros((stages + 1, n + 1), dtype=np.int64)
    worst[0][0] = squares[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            i = np.arange(k - 1, j)
            last = prefix[j] - prefix[i]
            big = np.maximum(worst[k - 1][i], last)
            even = squares[k - 1][i] + last ** 2
            ties = np.flatnonzero(big <= big.min() + slack)
            pick = int(ties[np.argmin(even[ties])])
            worst[k][j], squares[k][j], choice[k][j] = big[pick], even[pick], i[pick]
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(int(choice[k][bounds[-1]]))
    return bounds[::-1]


def _bounds_from_cuts(graph: Graph, cuts: Sequence[str], stages: int) -> list[int]:
    order = [n.name for n in graph.nodes]
    if len(cuts) != stages - 1:
        raise PartitionError(f"{stages} stages need {stages - 1} cut point(s) (the last node of "
                             f"each stage but the last), got {len(cuts)}: {list(cuts)}")
    bounds = [0]
    for cut in cuts:
        if cut not in order:
            near = [n for n in order if cut.lower() in n.lower() or n.lower() in cut.lower()]
            raise PartitionError(f"cut {cut!r} is not a node of graph {graph.name!r} "
                                 f"(nodes, in order: {near[:5] or order[:12]})")
        bounds.append(order.index(cut) + 1)
    bounds.append(len(order))
    if any(b <= a for a, b in zip(bounds[:-1], bounds[1:])):
        raise PartitionError(f"cuts {list(cuts)} must name nodes in execution order, each "
                             f"leaving a non-empty stage (order: {order})")
    return bounds


def partition(graph: Graph, stages: int, cuts: Sequence[str] = (),
              costs: dict[str, float] | None = None, balance: str = "params",
              tied: bool = False) -> Partition:
    """Cut ``graph`` into ``stages`` consecutive stages: after the nodes named in ``cuts``, or
    balancing ``costs`` (node name -> cost; default: parameter counts, ``node_costs``).

    Refused, naming the tensor: a state read in two stages, a parameter read in two stages
    unless ``tied`` (the caller then sums its gradients over them: each stage holds a copy,
    updated alike), and a graph output that no node produces.
    """
    if stages < 1:
        raise PartitionError(f"stages must be at least 1, got {stages}")
    nodes = graph.nodes
    if costs is None:
        costs = node_costs(graph, "params")
    if cuts:
        bounds, balance = _bounds_from_cuts(graph, cuts, stages), "cuts"
    else:
        bounds = balanced_bounds([costs.get(n.name, 0.0) for n in nodes], stages)
    stage_of = {}
    result = []
    for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        names = [n.name for n in nodes[a:b]]
        stage_of.update(dict.fromkeys(names, s))
        result.append(Stage(s, names, cost=float(sum(costs.get(n, 0.0) for n in names))))
    shared = _connect(graph, result, stage_of, tied)
    outputs = [t.name for t in graph.outputs]
    return Partition(result, outputs, balance, shared)


def _weight_only(graph: Graph) -> set[str]:
    """Nodes that read initializers (or nothing) alone, and nodes that read only their
    outputs: a Constant (a causal mask), a Transpose of a weight (an output head tied to an
    embedding). Their values have no batch axis and need no data."""
    inits, found = set(graph.initializers), set()
    made: set[str] = set()
    for node in graph.nodes:
        deps = node.dependencies()
        if all(x in inits or x in made for x in deps) and node.outputs:
            found.add(node.name)
            made.update(o for o in node.outputs if o)
    return found


def _place_weight_only(graph: Graph, stages: list[Stage], stage_of: dict[str, int]) -> None:
    """Compute a weight-only node (``_weight_only``) in every stage that reads its output
    (before that stage's own nodes), and no longer in its own stage if that one does not read
    it (unless the stage would be left empty): computing it is cheap, sending it is not, and
    it could not cross a cut (no batch axis)."""
    consumers = graph.consumers()
    weight_only = _weight_only(graph)
    # latest first, so that a chain of them (Constant -> Transpose) keeps its order in front
    for node in reversed(graph.nodes):
        if node.name not in weight_only:
            continue
        own = stage_of[node.name]
        readers = set()
        for out in node.outputs:
            for c in consumers.get(out, []) if out else []:
                readers.update(s.index for s in stages if c.name in s.nodes)
        for s in sorted(readers - {own}):
            stages[s].nodes.insert(0, node.name)
        if readers and own not in readers and len(stages[own].nodes) > 1:
            stages[own].nodes.remove(node.name)


def _connect(graph: Graph, stages: list[Stage], stage_of: dict[str, int],
             tied: bool = False) -> dict[str, list[int]]:
    """Fill in what each stage receives, sends, feeds and reads; returns the parameters read
    in several stages (``tied``) with their stages."""
    _place_weight_only(graph, stages, stage_of)
    by_name = {n.name: n for n in graph.nodes}
    last = len(stages) - 1
    declared = {t.name for t in graph.inputs} - set(graph.initializers)
    producer: dict[str, int] = {}
    order: list[str] = []  # produced tensors in execution order: the agreed message order
    last_use: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    local: set[str] = set()  # outputs of nodes computed in several stages: never sent
    for stage in stages:
        s = stage.index
        for node in (by_name[n] for n in stage.nodes):
            for name in dict.fromkeys(node.dependencies()):
                if name in graph.initializers:
                    readers.setdefault(name, set()).add(s)
                elif name in declared:
                    if name not in stage.feeds:
                        stage.feeds.append(name)
                elif name not in local:
                    last_use[name] = max(last_use.get(name, s), s)
            for out in node.outputs:
                if out and out in producer:
                    local.add(out)
                elif out:
                    producer[out] = s
                    order.append(out)
    for out in graph.outputs:
        if out.name not in producer:
            raise PartitionError(f"graph output {out.name!r} is not computed by a node; a "
                                 f"pipeline returns only computed outputs")
        last_use[out.name] = last
    roles = graph.roles
    shared: dict[str, list[int]] = {}
    for name, where in readers.items():
        if len(where) > 1 and roles[name] == "parameter" and tied:
            shared[name] = sorted(where)
        elif len(where) > 1 and roles[name] in ("parameter", "state"):
            raise PartitionError(f"{roles[name]} {name!r} is read by nodes of stages "
                                 f"{sorted(where)}: a tensor shared across stages would be "
                                 f"updated by each of them; choose cuts that keep its readers "
                                 f"in one stage")
        for s in where:
            stages[s].initializers.append(name)
    weight_only = _weight_only(graph)
    for name in order:
        if name in local or any(name in by_name[n].outputs for n in weight_only):
            continue  # every stage that reads it computes it
        for k in range(producer[name], last_use.get(name, producer[name])):
            stages[k].sends.append(name)
            stages[k + 1].receives.append(name)
    return shared


# -- per-node costs ----------------------------------------------------------------------------

def _params_read(graph: Graph) -> dict[str, float]:
    float_inits = {k for k, v in graph.initializers.items()
                   if np.issubdtype(v.dtype, np.floating) and v.ndim >= 1}
    return {n.name: float(sum(graph.initializers[x].size for x in dict.fromkeys(n.inputs)
                              if x in float_inits)) for n in graph.nodes}


def _flops(graph: Graph, values: dict[str, np.ndarray]) -> dict[str, float]:
    """Multiply-adds x 2 of the matrix ops, the output size of every other op (per batch)."""
    def size(name: str) -> int:
        return int(np.size(values[name])) if name in values else 0

    flops = {}
    for node in graph.nodes:
        out = size(node.outputs[0]) if node.outputs and node.outputs[0] else 0
        w = values.get(node.inputs[1]) if len(node.inputs) > 1 else None
        if node.op_type == "Gemm" and w is not None and w.ndim == 2:
            n_out = np.shape(values[node.outputs[0]])[-1]
            flops[node.name] = 2.0 * out * (w.size / max(n_out, 1))
        elif node.op_type == "MatMul" and node.inputs[0] in values:
            flops[node.name] = 2.0 * out * np.shape(values[node.inputs[0]])[-1]
        elif node.op_type in ("Conv", "ConvTranspose") and w is not None:
            per_output = w.size / max(w.shape[0], 1)
            base = out if node.op_type == "Conv" else size(node.inputs[0])
            flops[node.name] = 2.0 * base * per_output
        else:
            flops[node.name] = float(max(out, max((size(x) for x in node.inputs if x),
                                                  default=0)))
    return flops


def node_costs(graph: Graph, balance: str, executor_factory: Callable[[Graph], Any] | None
               = None, feeds: dict[str, np.ndarray] | None = None, loss: str = "loss",
               repeats: int = 5) -> dict[str, float]:
    """Cost of every node, by name, for balancing: ``params`` (floats it reads from
    initializers), ``flops`` (of one forward on ``feeds``) or ``measured`` (median over
    ``repeats`` forward + backward runs of ``feeds`` of the node's profiled time, in seconds).
    ``flops`` and ``measured`` run the whole graph on this rank with ``executor_factory``."""
    if balance not in BALANCES:
        raise PartitionError(f"balance {balance!r}: expected one of {BALANCES}")
    if balance == "params":
        return _params_read(graph)
    if executor_factory is None or feeds is None:
        raise PartitionError(f"balance {balance!r} runs the graph: give an executor and feeds")
    if balance == "flops":
        produced = [o for n in graph.nodes for o in n.outputs if o]
        values = executor_factory(graph).eval().inference(feeds, produced)
        return _flops(graph, {**graph.initializers, **feeds, **values})
    ex = executor_factory(graph)
    ex.profile = True
    ex.train(True)
    saved = {k: v.copy() for k, v in graph.state.items()}  # profiling must not train them
    runs: dict[str, list[float]] = {n.name: [] for n in graph.nodes}
    for _ in range(repeats + 1):  # the first run warms caches and allocators up
        ex.reset_profile()
        ex.inference_and_backprop(feeds, loss=loss)
        totals = dict.fromkeys(runs, 0.0)
        for node, _op, _phase, ns in ex.records:
            if node in totals:
                totals[node] += ns * 1e-9
        for name, t in totals.items():
            runs[name].append(t)
    for name, value in saved.items():
        graph.initializers[name][...] = value
    return {name: float(np.median(t[1:])) for name, t in runs.items()}
