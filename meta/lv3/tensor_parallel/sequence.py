"""Sequence parallelism of a tensor-parallel plan: the work every rank repeats, split by rows.

A tensor-parallel plan (``plan``) splits the layers of a transformer block, but between two
blocks every rank computes the same thing on the whole batch: the embeddings, the
LayerNorms, the bias and residual adds, the head and the loss (about 15 % of the GPT's step
at 2 ranks). Megatron-LM (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", 2022) splits that part by tokens instead: each rank computes its own
rows, and the two collectives of a block pair change, with the same bytes on the wire:

* the row-parallel layer's allreduce becomes a **reduce-scatter** (``ReduceScatterRows``):
  each rank keeps the sum of its own rows; backward, an all-gather of the gradient;
* the ``CopyToParallel`` before the column-parallel layers becomes an **all-gather**
  (``GatherRows``): the whole input from every rank's rows; backward, a reduce-scatter of
  the gradient (each rank's column layers contributed a part of every row's gradient),
  overlapped with the weight gradients as the allreduce it replaces
  (``meta.lv1.plan.overlap``);
* the data enter through ``ScatterRows`` (this rank's rows), a graph output split by rows
  leaves through ``GatherRows`` (run only when asked for), and a mean loss over the rows
  as each rank's part of it (``ShareOfMean``: its mean weighted by its share of the counted
  labels, which the whole labels every rank is fed give without a message);
* the parameters every rank holds whole and only the row-split part reads (the embeddings,
  LayerNorms, the biases after a reduce-scatter, the head) get on each rank the gradient of
  its own rows: ``Plan.partial_gradients``, summed over the ranks after the backward in one
  allreduce with the loss's parts (``Plan.partial_outputs``; ``strategy.
  PartitionedExecutor``), so every rank's update stays the same.

Rows are the batch axis (axis 0) in ``np.array_split`` order (``ops.rows``): for a
per-token network the same split as Megatron's by sequence positions, and contiguous in
memory. Only operators that act on each row alone are split (``_rowwise``); a graph that has
any other one in the replicated part keeps the plain tensor-parallel plan (``apply`` returns
None), as does a graph whose replicated part holds no parameters of its own (no
LayerNorm, embedding or head: an MLP's activations and its loss are not worth the two extra
meetings per pair).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from meta.lv1.graph import Graph, Node
from meta.lv3.tensor_parallel.ops import DOMAIN
from meta.lv3.tensor_parallel.parts import Collective, Layer, Plan

ROWWISE = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Softplus", "Softsign", "Gelu",
    "Erf", "HardSigmoid", "HardSwish", "Identity", "Neg", "Abs", "Exp", "Sqrt", "Log",
    "Reciprocal", "Cast", "Add", "Sub", "Mul", "Div", "Pow"})
"""Elementwise operators (broadcasting ones too, when the other operands have no batch
axis): a tensor split by rows stays split."""


class _NotRowwise(Exception):
    """The replicated part has an operator that needs every row: no sequence parallelism."""


def apply(plan_: Plan, graph: Graph, shapes: dict, group: int) -> Plan | None:
    """``plan_`` (a tensor-parallel ``Plan``) with its replicated part split by rows, or None
    when the graph does not allow it (the module docstring)."""
    try:
        return _Rows(plan_, graph, shapes, group).run()
    except _NotRowwise:
        return None


class _Rows:
    def __init__(self, plan_: Plan, graph: Graph, shapes: dict, group: int) -> None:
        self.p, self.graph, self.shapes, self.group = plan_, graph, shapes, group
        self.inputs = [t.name for t in graph.inputs]
        self.outputs = {t.name for t in graph.outputs}
        self.inits = graph.initializers
        self.roles = graph.roles
        # tensors with the batch on axis 0, and the graph inputs each comes from
        self.fed: dict[str, set[str]] = {x: {x} for x in self.inputs}
        for node in plan_.nodes:
            came = set().union(*(self.fed.get(x, set()) for x in node.inputs if x))
            if came:
                for y in node.outputs:
                    if y:
                        self.fed[y] = came
        self.rows: dict[str, str] = {}  # a batch tensor -> the name of its rows on this rank
        self.nodes: list[Node] = []
        self.collectives: list = []
        self.layers = dict(plan_.layers)
        self.reads_rows: set[str] = set()  # non-batch tensors the row-split nodes read
        self.reads_whole: set[str] = set()  # ... and the other nodes
        self.renamed: dict[str, str] = {}  # graph output -> its rows, gathered at the end
        self.partial_outputs: list[str] = []  # each rank's part of them: summed
        self.output_bytes = 0  # theirs

    # -- helpers -------------------------------------------------------------------------
    def _ndim(self, name: str) -> int:
        if name in self.inits:
            return self.inits[name].ndim
        return len(self.shapes[name][0]) + 1  # ``probe`` leaves out every tensor's axis 0

    def _collective(self, tensor: str, phase: str, kind: str, fixed: int = 0) -> None:
        shape, dtype = self.shapes[tensor] if tensor in self.shapes else ((), np.float32)
        elements = int(np.prod(shape, dtype=np.int64)) if not fixed else 0
        self.collectives.append(Collective(tensor, phase, elements, np.dtype(dtype).itemsize,
                                           kind, fixed))

    def _ref(self, name: str) -> str:
        """A graph input ``name`` comes from (it says how many rows the batch has)."""
        came = self.fed[name]
        return next(x for x in self.inputs if x in came)

    def _needs_grad(self, name: str) -> bool:
        from meta.lv1.roles import differentiable

        if not hasattr(self, "_grad"):
            self._grad = differentiable(self.graph)
        base = name.split("@")[0]
        return name in self._grad or base in self._grad

    def _rows_of(self, x: str) -> str:
        """``x``'s rows on this rank: a row-split tensor itself, else through ScatterRows."""
        if x in self.rows:
            return self.rows[x]
        if x in self.renamed:
            return self.renamed[x]
        name = f"{x}@rows"
        self.nodes.append(Node("ScatterRows", [x], [name], f"{x}/rows", DOMAIN,
                               {"group": self.group}))
        if x not in self.inputs and self._needs_grad(x):
            self._collective(x, "backward", "allgather")
        self.rows[x] = name
        return name

    # -- the walk ------------------------------------------------------------------------
    def run(self) -> Plan:
        p = self.p
        for node in p.nodes:
            if node.domain == DOMAIN:
                self._collective_node(node)
                continue
            layer = p.layers.get(node.name)
            batch = [x for x in node.inputs if x in self.fed]
            if layer is None or layer.kind != "replicated" or not batch:
                if any(x in self.rows for x in node.inputs):  # a split layer reading rows
                    raise _NotRowwise(node.name)
                if layer is None or layer.kind != "replicated":  # not of parameters alone
                    self.reads_whole.update(x for x in node.inputs if x and x not in self.fed)
                self.nodes.append(node)
                continue
            self._rowwise(node)
        if not any(layer.kind == "rows" for layer in self.layers.values()):
            raise _NotRowwise("nothing replicated to split")
        for y, name in self.renamed.items():  # graph outputs: gathered when asked for
            self.nodes.append(Node("GatherRows", [name, self._ref(y)], [y], f"{y}/gather",
                                   DOMAIN, {"group": self.group, "reduce": 0}))
            self._collective(y, "output", "allgather")
        partial = self._partial_gradients()
        if not partial:  # activations and a loss alone: not worth the extra meetings
            raise _NotRowwise("no parameters in the replicated part")
        return dataclasses.replace(p, nodes=self.nodes, layers=self.layers,
                                   collectives=self.collectives, partial_gradients=partial,
                                   partial_outputs=self.partial_outputs)

    def _collective_node(self, node: Node) -> None:
        x, y = node.inputs[0], node.outputs[0]
        if node.op_type == "CopyToParallel" and x in self.rows:
            self.nodes.append(Node("GatherRows", [self.rows[x], self._ref(x)], [y],
                                   node.name, DOMAIN, {"group": self.group, "reduce": 1}))
            self._collective(x, "forward", "allgather")
            self._collective(x, "backward", "reduce_scatter")
        elif node.op_type == "AllReduceSum":
            name = f"{y}@rows"
            self.nodes.append(Node("ReduceScatterRows", [x], [name],
                                   node.name.replace("/allreduce", "/reduce_scatter"),
                                   DOMAIN, {"group": self.group}))
            self.rows[y] = name
            self._collective(y, "forward", "reduce_scatter")
            if self._needs_grad(x):
                self._collective(y, "backward", "allgather")
        elif node.op_type == "CopyToParallel":
            self.nodes.append(node)
            self._collective(x, "backward", "allreduce")
        else:
            raise _NotRowwise(node.name)

    def _rowwise(self, node: Node) -> None:
        op, a = node.op_type, node.attrs
        ins = [x for x in node.inputs]
        outs = [y for y in node.outputs if y]
        if len(outs) != 1 or len(node.outputs) != 1:
            raise _NotRowwise(node.name)
        if op == "SoftmaxCrossEntropyLoss":
            self._loss(node)
            return
        y = outs[0]
        ny = self._ndim(y)
        batch = {i for i, x in enumerate(ins) if x in self.fed}
        ok = False
        if op in ROWWISE:  # the other operands broadcast from the right, no batch axis
            ok = all(self._ndim(x) < ny or (x in self.inits and self.inits[x].shape[0] == 1)
                     for i, x in enumerate(ins) if x and i not in batch)
            ok = ok and all(self._ndim(ins[i]) == ny for i in batch)
        elif op in ("LayerNormalization", "Softmax", "LogSoftmax"):
            ok = batch == {0} and int(a.get("axis", -1)) % ny != 0
        elif op == "MatMul":
            ok = batch == {0} and self._ndim(ins[1]) == 2 and ny >= 2
        elif op == "Gemm":
            ok = batch == {0} and not a.get("transA", 0)
        elif op == "Gather":
            ok = batch == {1} and int(a.get("axis", 0)) == 0
        elif op == "Transpose":
            ok = batch == {0} and list(a.get("perm", [1]))[0] == 0
        elif op == "Flatten":
            ok = batch == {0} and int(a.get("axis", 1)) >= 1
        elif op == "Reshape":
            shape = self.inits.get(ins[1]) if len(ins) > 1 else None
            ok = batch == {0} and shape is not None and shape.ndim == 1 and len(shape) \
                and int(shape[0]) == 0 and not a.get("allowzero", 0)
        if not ok:
            raise _NotRowwise(node.name)
        for i in batch:
            ins[i] = self._rows_of(ins[i])
        self.reads_rows.update(x for i, x in enumerate(ins) if x and i not in batch)
        name = self._output(y)
        self.nodes.append(dataclasses.replace(node, inputs=ins, outputs=[name],
                                              attrs=dict(a)))
        self.layers[node.name] = _layer(self.p.ranks)

    def _output(self, y: str) -> str:
        name = f"{y}@rows"
        self.rows[y] = name
        if y in self.outputs:
            self.renamed[y] = name
        return name

    def _loss(self, node: Node) -> None:
        """A mean loss: each rank's over its rows, then its part of the whole mean
        (``ShareOfMean``), summed with the gradients."""
        a = node.attrs
        if len(node.inputs) != 2 or a.get("reduction", "mean") != "mean" or \
                node.inputs[1] not in self.fed or node.inputs[0] not in self.fed:
            raise _NotRowwise(node.name)
        scores, labels = (self._rows_of(x) for x in node.inputs)
        y = node.outputs[0]
        local = f"{y}@rows"
        self.nodes.append(dataclasses.replace(node, inputs=[scores, labels], outputs=[local],
                                              attrs=dict(a)))
        self.nodes.append(Node("ShareOfMean", [local, labels, node.inputs[1]], [y],
                               f"{node.name}/share", DOMAIN,
                               {"ignore_index": int(a.get("ignore_index", -100))}))
        self.partial_outputs.append(y)
        self.output_bytes += np.dtype(self.shapes[node.inputs[0]][1]).itemsize
        self.layers[node.name] = _layer(self.p.ranks)

    def _partial_gradients(self) -> list[str]:
        """The parameters whose gradient on each rank is its rows' (read by the row-split
        nodes, directly or through nodes of parameters alone: the tied head's Transpose);
        refused when one of them also reaches a node that computes it whole."""
        producer = {y: n for n in self.nodes for y in n.outputs if y}
        found: set[str] = set()

        def sources(x: str, into: set[str]) -> None:
            if x in self.inits:
                if self.roles.get(x) == "parameter":
                    into.add(x)
                return
            node = producer.get(x)
            if node is not None:
                for z in node.inputs:
                    if z and z not in self.fed:
                        sources(z, into)

        for x in self.reads_rows:
            sources(x, found)
        whole: set[str] = set()
        for x in self.reads_whole:
            sources(x, whole)
        if found & whole:
            raise _NotRowwise(f"parameters {sorted(found & whole)} read by both parts")
        names = [n for n in self.inits if n in found]
        if names or self.partial_outputs:  # one allreduce of them and the loss's parts
            fixed = sum(self.inits[n].nbytes for n in names) + self.output_bytes
            self._collective("parameters", "backward", "allreduce", fixed=fixed)
        return names


def _layer(ranks: int) -> Layer:
    return Layer("rows", 1.0 / ranks)
