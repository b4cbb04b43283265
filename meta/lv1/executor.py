"""Executors: run a graph forward (inference) and backward (gradients of a loss)."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from meta.lv0 import Context, InferenceContext, Operator, UnknownOperatorError, lookup
from meta.lv1.graph import Graph, GraphError, Node

Tensors = dict[str, np.ndarray]


class ExecutionError(RuntimeError):
    """An operator failed while running; the message names the node and its inputs."""


def _describe(value: np.ndarray | None) -> str:
    return "absent" if value is None else f"{value.dtype}{list(np.shape(value))}"


class ReferenceExecutor:
    """Runs a graph with numpy operators (or the first of ``backends`` that implements each op).

    Operators are resolved when the executor is built, so an unknown op fails here, naming the
    node. Parameters are read from ``graph.initializers`` on every call, so in-place optimizer
    updates take effect at once.

    >>> from meta.lv1.builder import mlp
    >>> ex = ReferenceExecutor(mlp(hidden=[8]))
    >>> x = np.zeros((2, 1, 28, 28), np.float32)
    >>> ex.inference({"input": x}, ["logits"])["logits"].shape
    (2, 10)
    """

    backends: tuple[str, ...] = ("numpy",)

    def __init__(self, graph: Graph, backends: Sequence[str] | None = None) -> None:
        self.graph = graph
        self.backends = tuple(backends or self.backends)
        self.ops: dict[str, Operator] = {n.name: self._make_op(n) for n in graph.nodes}

    def _make_op(self, node: Node) -> Operator:
        opset = self.graph.opset.get(node.domain, self.graph.opset.get("", 1))
        try:
            cls = lookup(node.op_type, opset, node.domain, self.backends)
            return cls(**node.attrs)
        except UnknownOperatorError as err:
            raise GraphError(f"{node.describe()}: {err}") from err
        except TypeError as err:
            raise GraphError(f"{node.describe()}: {err}") from err

    # -- feeds ---------------------------------------------------------------------------
    def _check_feeds(self, feeds: Tensors, nodes: list[Node]) -> None:
        declared = {t.name: t for t in self.graph.inputs}
        unknown = sorted(set(feeds) - set(declared) - set(self.graph.initializers))
        if unknown:
            raise GraphError(f"feeds {unknown} are not inputs of graph {self.graph.name!r} "
                             f"(inputs: {sorted(declared)})")
        needed = {x for n in nodes for x in n.inputs if x}
        for name, info in declared.items():
            if name not in feeds:
                if name in needed:
                    raise GraphError(f"graph input {name!r} is needed but was not fed")
                continue
            value = feeds[name]
            if value.dtype != info.dtype:
                raise GraphError(f"input {name!r}: expected {info.dtype}, got {value.dtype}")
            if info.shape is not None:
                fixed = [d if isinstance(d, int) else None for d in info.shape]
                if len(fixed) != value.ndim or any(
                        d is not None and d != s for d, s in zip(fixed, value.shape)):
                    raise GraphError(f"input {name!r}: expected shape {list(info.shape)}, "
                                     f"got {list(value.shape)}")

    # -- forward -------------------------------------------------------------------------
    def _forward(self, feeds: Tensors, outputs: Iterable[str], requires_grad: set[str] | None):
        outputs = list(outputs)
        nodes = self.graph.nodes_for(outputs)
        self._check_feeds(feeds, nodes)
        values: dict[str, np.ndarray] = {**self.graph.initializers, **feeds}
        tape: list[tuple[Node, Context]] = []
        inference = InferenceContext()
        for node in nodes:
            args = [values[x] if x else None for x in node.inputs]
            if requires_grad is None:
                ctx = inference
            else:
                ctx = Context([bool(x) and x in requires_grad for x in node.inputs])
            try:
                results = self.ops[node.name].apply(ctx, *args)
            except Exception as err:
                shapes = ", ".join(f"{x or '-'}: {_describe(a)}" for x, a in zip(node.inputs, args))
                raise ExecutionError(f"{node.describe()} failed on inputs ({shapes}): {err}") \
                    from err
            for name, value in zip(node.outputs, results):
                if name:
                    values[name] = value
            if requires_grad is not None and any(ctx.needs_input_grad):
                requires_grad.update(o for o in node.outputs if o)
                tape.append((node, ctx))
        missing = [o for o in outputs if o not in values]
        if missing:
            raise GraphError(f"outputs {missing} are not produced by graph {self.graph.name!r}")
        return values, tape

    def inference(self, feeds: Tensors, outputs: Iterable[str] | None = None) -> Tensors:
        """Compute ``outputs`` (default: the graph outputs) from ``feeds``; keeps no tape."""
        names = list(outputs) if outputs is not None else [t.name for t in self.graph.outputs]
        values, _ = self._forward(feeds, names, None)
        return {n: values[n] for n in names}

    def inference_and_backprop(
        self, feeds: Tensors, loss: str = "loss", outputs: Iterable[str] | None = None
    ) -> tuple[Tensors, Tensors]:
        """Forward to ``loss`` (plus ``outputs``), then backward; returns (values, gradients).

        Gradients are those of the scalar ``loss`` with respect to every parameter.
        """
        params = self.graph.parameters
        names = [loss, *(outputs or [])]
        values, tape = self._forward(feeds, names, set(params))
        if np.size(values[loss]) != 1:
            raise GraphError(f"loss {loss!r} must be a scalar, got shape {np.shape(values[loss])}")
        grads: dict[str, np.ndarray] = {loss: np.ones_like(values[loss])}
        for node, ctx in reversed(tape):
            grad_outputs = [grads.get(o) if o else None for o in node.outputs]
            if all(g is None for g in grad_outputs):
                continue
            grad_inputs = self.ops[node.name].backward(ctx, *grad_outputs)
            for name, g, wanted in zip(node.inputs, grad_inputs, ctx.needs_input_grad):
                if wanted and g is not None:
                    grads[name] = grads[name] + g if name in grads else g
        param_grads = {p: grads[p] if p in grads else np.zeros_like(v) for p, v in params.items()}
        return {n: values[n] for n in names}, param_grads
