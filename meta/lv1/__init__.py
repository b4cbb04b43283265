"""Level 1: network graphs (built in code or loaded from ONNX) and the executors that run them."""

from meta.lv1.builder import GraphBuilder, mlp
from meta.lv1.executor import ExecutionError, ReferenceExecutor
from meta.lv1.graph import Graph, GraphError, Node, TensorInfo
from meta.lv1.onnx_io import ONNXLoadError, from_onnx, save_onnx, to_onnx

__all__ = [
    "ExecutionError",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "Node",
    "ONNXLoadError",
    "ReferenceExecutor",
    "TensorInfo",
    "from_onnx",
    "mlp",
    "save_onnx",
    "to_onnx",
]
