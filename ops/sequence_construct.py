"""SequenceConstruct (ONNX opset 11+): a sequence of the inputs (tensors of one type)."""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("SequenceConstruct", since=11)
class SequenceConstruct(Operator):
    """ONNX SequenceConstruct-11: construct a tensor sequence containing 'inputs' tensors."""
    def forward(self, ctx, *tensors):
        if len({t.dtype for t in tensors}) > 1:
            raise ValueError(f"SequenceConstruct: inputs of several types "
                             f"{sorted({str(t.dtype) for t in tensors})}")
        return (list(tensors),)
