"""Building graphs node by node (``GraphBuilder``): what the layer API (``meta.lv1.layers``)
and the model builders (``meta.lv1.models``) write through."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from meta.common.moved import forward_names
from meta.lv1.graph import Dim, Graph, Node, TensorInfo

DEFAULT_OPSET = 17


def _as_onnx_attribute(value: Any) -> Any:
    """Floats rounded to float32, as ONNX stores them: a graph built in code then computes
    exactly what the same graph computes after a save and load."""
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value):
        return [float(np.float32(v)) for v in value]
    return value


class GraphBuilder:
    """Collects inputs, initializers and nodes, then builds a ``Graph``.

    >>> b = GraphBuilder("tiny")
    >>> x = b.input("x", np.float32, ("N", 3))
    >>> y = b.node("Relu", [x])
    >>> b.output(y, np.float32, ("N", 3))
    >>> b.build().nodes[0].op_type
    'Relu'
    """

    def __init__(self, name: str = "graph", opset: int = DEFAULT_OPSET) -> None:
        self.name = name
        self.opset = {"": opset}
        self.inputs: list[TensorInfo] = []
        self.outputs: list[TensorInfo] = []
        self.initializers: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []

    def opset_import(self, domain: str, version: int) -> None:
        """Import ``domain`` at ``version`` (ai.onnx is ``""``); a custom domain is imported at 1
        unless this says otherwise."""
        self.opset[domain] = version

    def input(self, name: str, dtype: Any, shape: Sequence[Dim]) -> str:
        """Declare a graph input fed at run time; returns its name for ``node``."""
        self.inputs.append(TensorInfo(name, dtype, tuple(shape)))
        return name

    def initializer(self, name: str, value: np.ndarray) -> str:
        """Add a named constant or parameter value (kept C-contiguous); returns its name for
        ``node``."""
        value = np.asarray(value)  # (np.ascontiguousarray would make a 0-d array 1-d)
        self.initializers[name] = value if value.flags.c_contiguous else value.copy(order="C")
        return name

    def node(self, op_type: str, inputs: Sequence[str], n_outputs: int = 1,
             name: str | None = None, outputs: Sequence[str] | None = None, domain: str = "",
             **attrs: Any) -> str | list[str]:
        """Add a node; returns its output name (or names when it has several).

        A custom ``domain`` is imported at version 1 unless ``opset_import`` said otherwise.
        """
        name = name or f"{op_type.lower()}{len(self.nodes)}"
        outs = list(outputs) if outputs else [f"{name}_out{i}" if n_outputs > 1 else name
                                               for i in range(n_outputs)]
        self.opset.setdefault(domain, 1)
        self.nodes.append(Node(op_type, list(inputs), outs, name=name, domain=domain,
                               attrs={k: _as_onnx_attribute(v) for k, v in attrs.items()}))
        return outs[0] if len(outs) == 1 else outs

    def output(self, name: str, dtype: Any, shape: Sequence[Dim] | None = None) -> None:
        """Declare ``name`` a graph output (its shape may be left unknown)."""
        self.outputs.append(TensorInfo(name, dtype, None if shape is None else tuple(shape)))

    def build(self) -> Graph:
        """The ``Graph`` built so far.

                >>> import numpy as np
                >>> b = GraphBuilder("tiny")
                >>> x = b.input("x", np.float32, (1, 4))
                >>> b.output(b.node("Relu", [x], name="y"), np.float32)
                >>> [n.op_type for n in b.build().nodes]
                ['Relu']
        """
        return Graph(self.nodes, self.inputs, self.outputs, self.initializers, self.opset,
                     self.name)


# meta.lv1.builder.mlp moved beside the other model builders (meta.lv1.models; meta.lv1.mlp is
# its public name): the old name still works, with a DeprecationWarning, for one release
__getattr__ = forward_names(__name__, "meta.lv1.models")
