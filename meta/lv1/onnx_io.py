"""Loading graphs from ONNX models and saving them back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from meta.lv1.graph import Dim, Graph, GraphError, Node, TensorInfo


class ONNXLoadError(GraphError):
    """An ONNX file or model that cannot be read into a graph."""


def _attr_value(attr: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list) and value and isinstance(value[0], bytes):
        return [v.decode("utf-8") for v in value]
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tensor = value.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    shape: tuple[Dim, ...] | None = None
    if tensor.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor.shape.dim
        )
    return TensorInfo(value.name, dtype, shape)


def read_model(source: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """Parse a model file (or pass a ModelProto through), with a clear error on bad files."""
    if isinstance(source, onnx.ModelProto):
        return source
    path = Path(source)
    if not path.is_file():
        raise ONNXLoadError(f"{path}: no such ONNX file")
    try:
        return onnx.load(str(path))
    except Exception as err:  # protobuf raises DecodeError and friends
        raise ONNXLoadError(f"{path}: not a readable ONNX model ({type(err).__name__}: {err})") \
            from err


def from_onnx(source: onnx.ModelProto | str | os.PathLike) -> Graph:
    """Build a ``Graph`` from an ONNX ModelProto or file path."""
    model = read_model(source)
    g = model.graph
    initializers = {t.name: numpy_helper.to_array(t).copy() for t in g.initializer}
    nodes = [
        Node(n.op_type, list(n.input), list(n.output), n.name, n.domain,
             {a.name: _attr_value(a) for a in n.attribute})
        for n in g.node
    ]
    opset = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    # Graph inputs that name an initializer are defaults, not required feeds.
    inputs = [_tensor_info(v) for v in g.input if v.name not in initializers]
    outputs = [_tensor_info(v) for v in g.output]
    return Graph(nodes, inputs, outputs, initializers, opset, g.name or "graph")


def _value_info(info: TensorInfo) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(info.dtype)
    return helper.make_tensor_value_info(info.name, elem, None if info.shape is None
                                         else list(info.shape))


def to_onnx(graph: Graph, outputs: Iterable[str] | None = None) -> onnx.ModelProto:
    """The graph (pruned to ``outputs`` if given) as a checked ONNX ModelProto."""
    wanted = [t for t in graph.outputs if outputs is None or t.name in set(outputs)]
    if outputs is not None and len(wanted) != len(set(outputs)):
        missing = set(outputs) - {t.name for t in wanted}
        raise GraphError(f"to_onnx: {sorted(missing)} are not outputs of graph {graph.name!r}")
    nodes = graph.nodes_for(t.name for t in wanted)
    used = {x for n in nodes for x in n.inputs if x}
    onnx_nodes = [
        helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, domain=n.domain or None,
                         **{k: v for k, v in n.attrs.items() if v is not None})
        for n in nodes
    ]
    onnx_graph = helper.make_graph(
        onnx_nodes,
        graph.name,
        [_value_info(t) for t in graph.inputs if t.name in used],
        [_value_info(t) for t in wanted],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in graph.initializers.items()
         if k in used],
    )
    opsets = [helper.make_opsetid(d, v) for d, v in graph.opset.items()]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="meta")
    onnx.checker.check_model(model, full_check=True)
    return model


def save_onnx(graph: Graph, path: str | os.PathLike, outputs: Iterable[str] | None = None) -> Path:
    """Write the graph to an ONNX file that ``onnx.checker`` accepts; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = to_onnx(graph, outputs)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)  # never leave a half-written model behind
    return path
