"""Rewrites of subgraphs that exporters spell out op by op into the one operator they compute,
so a single kernel runs them (onnxruntime's graph transformers do the same).

``gelu``: PyTorch's TorchScript exporter writes GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))``
(Div, Erf, Add, Mul, Mul); Erf alone has no oneDNN kernel and numpy's took two thirds of a
transformer's training step. The five nodes become one Gelu (ONNX opset 20's, exact form).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from meta.lv0 import Operator, lookup
from meta.lv1.graph import Node


def _scalar(values: dict[str, np.ndarray], name: str, expected: float) -> bool:
    v = values.get(name)
    return v is not None and v.size == 1 and math.isclose(float(v.reshape(())), expected,
                                                          rel_tol=1e-5)


def _other(node: Node, name: str) -> str | None:
    """The input of a binary ``node`` that is not ``name`` (None if it reads it twice)."""
    a, b = node.inputs[:2]
    return b if a == name else a if b == name else None


def gelu(nodes: list[Node], static: dict[str, np.ndarray], protected: set[str],
         backends: Sequence[str]
         ) -> tuple[list[Node], dict[str, Operator], dict[str, str]]:
    """``nodes`` with every spelled-out exact GELU replaced by one Gelu node, the operators of
    the new nodes, and each replaced node's name -> its Gelu's."""
    readers: dict[str, list[Node]] = {}
    for n in nodes:
        for x in n.inputs:
            if x:
                readers.setdefault(x, []).append(n)

    def only(name: str, op_type: str) -> Node | None:
        r = readers.get(name, [])
        if len(r) != 1 or r[0].op_type != op_type or name in protected:
            return None
        return r[0]

    producers = {o: n for n in nodes for o in n.outputs if o}
    removed: set[str] = set()
    added: dict[str, Node] = {}  # the node replaced -> the Gelu standing in its place
    ops: dict[str, Operator] = {}
    merged: dict[str, str] = {}
    gelu_op = lookup("Gelu", 20, "", backends)
    for erf in (n for n in nodes if n.op_type == "Erf"):
        div = producers.get(erf.inputs[0])
        if div is None or div.op_type not in ("Div", "Mul") or erf.inputs[0] in protected \
                or len(readers.get(erf.inputs[0], [])) != 1:
            continue
        x = div.inputs[0]
        scale = math.sqrt(2) if div.op_type == "Div" else 1 / math.sqrt(2)
        if not _scalar(static, div.inputs[1], scale):
            continue
        add = only(erf.outputs[0], "Add")
        if add is None or not _scalar(static, _other(add, erf.outputs[0]) or "", 1.0):
            continue
        mul = only(add.outputs[0], "Mul")
        if mul is None:
            continue
        other = _other(mul, add.outputs[0])
        if other == x:  # (x * (1 + erf)) * 0.5
            last = only(mul.outputs[0], "Mul")
            if last is None or not _scalar(static, _other(last, mul.outputs[0]) or "", 0.5):
                continue
            group = [div, erf, add, mul, last]
        else:  # (x * 0.5) * (1 + erf)
            half = producers.get(other or "")
            if half is None or half.op_type != "Mul" or _other(half, x) is None \
                    or not _scalar(static, _other(half, x), 0.5) \
                    or len(readers.get(other, [])) != 1 or other in protected:
                continue
            last = mul
            group = [div, erf, add, half, mul]
        node = Node("Gelu", [x], [last.outputs[0]], f"{erf.name}/gelu")
        ops[node.name] = gelu_op(approximate="none")
        removed.update(n.name for n in group)
        merged.update((n.name, node.name) for n in group)
        added[last.name] = node
    if not added:
        return nodes, {}, {}
    out = []
    for n in nodes:
        if n.name in added:
            out.append(added[n.name])
        elif n.name not in removed:
            out.append(n)
    return out, ops, merged
