"""SequenceEmpty (ONNX opset 11+): an empty sequence (its ``dtype`` is not kept: a Python
list has none)."""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("SequenceEmpty", since=11)
class SequenceEmpty(Operator):
    """ONNX SequenceEmpty-11: construct an empty tensor sequence, with given data type."""
    attributes = {"dtype": None}

    def forward(self, ctx):
        return []
