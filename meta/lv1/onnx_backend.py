"""ONNX's backend API (``onnx.backend.base.Backend``) over meta's reference executor.

This is what lets ONNX's own conformance runner, ``onnx.backend.test.BackendTest``, drive meta
as it drives onnxruntime; it also serves users who write against the backend API::

    >>> import numpy as np
    >>> from onnx import TensorProto, helper
    >>> from meta.lv1.onnx_backend import MetaBackend
    >>> node = helper.make_node("Relu", ["x"], ["y"])
    >>> MetaBackend.run_node(node, [np.array([-1.0, 2.0], np.float32)])[0].tolist()
    [0.0, 2.0]

Models are loaded with ``meta.lv1.from_onnx`` (so an unsupported model fails at ``prepare``
with every unknown operator named) and run with ``ReferenceExecutor`` on the CPU.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from meta.lv1 import GraphError, ONNXLoadError, ReferenceExecutor, from_onnx

__all__ = ["MetaBackend", "MetaRep", "prepare", "run_model", "run_node", "supports_device"]


def _value(value: Any) -> Any:
    """An array, or a sequence (list) or empty optional (None) as it is."""
    return value if isinstance(value, list) or value is None else np.asarray(value)


def _value_info(name: str, value: Any) -> onnx.ValueInfoProto:
    """The graph input declaring ``value``: a tensor, or a sequence of its first item's type."""
    if isinstance(value, list):
        elem = helper.np_dtype_to_tensor_dtype(np.asarray(value[0]).dtype) if value \
            else onnx.TensorProto.FLOAT
        return helper.make_tensor_sequence_value_info(name, elem, None)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                         None)


class MetaRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (in graph-input order, initializers
    left out) or a dict of arrays and returns the graph outputs as a named tuple."""

    def __init__(self, model: onnx.ModelProto, executor: ReferenceExecutor) -> None:
        self.executor = executor
        initializers = {t.name for t in model.graph.initializer}
        self.input_names = [v.name for v in model.graph.input if v.name not in initializers]
        self.output_names = [v.name for v in model.graph.output]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise ValueError(f"MetaRep.run: {len(inputs)} inputs for graph inputs "
                                 f"{self.input_names}")
            feeds = dict(zip(self.input_names, inputs))
        outputs = self.executor.inference(feeds, self.output_names)
        return namedtupledict("Outputs", self.output_names)(
            *(_value(outputs[n]) for n in self.output_names))


class MetaBackend(Backend):
    """meta as an ONNX backend (CPU only)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        """Whether meta can load ``model`` (its operators registered) and runs on ``device``."""
        if not cls.supports_device(device):
            return False
        try:
            from_onnx(model)
        except (ONNXLoadError, GraphError):
            return False
        return True

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> MetaRep:
        """Check ``model`` and load it for running on meta's reference executor (CPU only)."""
        if not cls.supports_device(device):
            raise ValueError(f"meta runs on the CPU only, not on {device!r}")
        super().prepare(model, device, **kwargs)  # onnx.checker
        return MetaRep(model, ReferenceExecutor(from_onnx(model)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run ``model`` once on ``inputs``; returns its outputs in order."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on ``inputs`` (a list matching ``node.input``, or a dict); the model
        around it imports ``opset_version`` (default: onnx's newest) of the node's domain."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        if isinstance(inputs, dict):
            given = dict(inputs)
        else:
            given = {name: value for name, value in zip(node.input, inputs) if name}
        given = {k: _value(v) for k, v in given.items()}
        graph = helper.make_graph(
            [node], "run_node",
            [_value_info(k, v) for k, v in given.items()],
            [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
             for o in node.output if o])
        version = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        opsets = [helper.make_opsetid(node.domain or "", version)]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(helper.make_opsetid("", onnx.defs.onnx_opset_version()))
        model = helper.make_model(graph, opset_imports=opsets)
        rep = MetaRep(model, ReferenceExecutor(from_onnx(model)))
        return rep.run(given)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:
            return False


prepare = MetaBackend.prepare
run_model = MetaBackend.run_model
run_node = MetaBackend.run_node
supports_device = MetaBackend.supports_device
