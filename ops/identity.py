"""Identity: y = x (ONNX opset 1+)."""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("Identity", since=1)
class Identity(Operator):
    """ONNX Identity-1: Identity operator."""
    def forward(self, ctx, x):
        return x

    def backward(self, ctx, dy):
        return (dy,)
