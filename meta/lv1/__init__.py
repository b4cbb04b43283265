"""Level 1: network graphs (built in code or loaded from ONNX) and the executors that run them."""

from meta.lv1 import layers  # models in code: Sequential(Conv(6, 5), Relu(), ...)
from meta.lv1.builder import GraphBuilder
from meta.lv1.executor import (
    EXECUTORS,
    ExecutionError,
    NativeExecutor,
    Profile,
    ProfileRow,
    ReferenceExecutor,
)
from meta.lv1.graph import Graph, GraphError, Node, TensorInfo, make_operator
from meta.lv1.language_models import gpt, lstm_lm
from meta.lv1.layers import Sequential
from meta.lv1.models import MODELS, build_model, lenet5, mlp, resnet20, vgg_small, wide_cnn
from meta.lv1.onnx_io import (
    ONNXLoadError,
    from_onnx,
    read_model,
    save_onnx,
    shape_inference,
    to_onnx,
)
from meta.lv1.onnx_model import onnx_model
from meta.lv1.ort_executor import OnnxRuntimeExecutor  # registers "onnxruntime", lazily
from meta.lv1.plan import PlannedExecutor  # registers "planned"
from meta.lv1.sequence_models import lstm
from meta.lv1.torch_executor import TorchExecutor  # registers "pytorch"; imports no torch

__all__ = [
    "EXECUTORS",
    "MODELS",
    "build_model",
    "layers",
    "lstm",
    "onnx_model",
    "NativeExecutor",
    "ExecutionError",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "Node",
    "ONNXLoadError",
    "OnnxRuntimeExecutor",
    "PlannedExecutor",
    "Profile",
    "ProfileRow",
    "ReferenceExecutor",
    "Sequential",
    "TensorInfo",
    "TorchExecutor",
    "from_onnx",
    "lenet5",
    "resnet20",
    "vgg_small",
    "wide_cnn",
    "make_operator",
    "mlp",
    "read_model",
    "save_onnx",
    "shape_inference",
    "to_onnx",
]
