"""BitwiseNot: ~x of an integer tensor (ONNX opset 18+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("BitwiseNot", since=18)
class BitwiseNot(Operator):
    """ONNX BitwiseNot-18: returns the bitwise not of the input tensor element-wise."""
    def forward(self, ctx, x):
        return np.bitwise_not(x)

    def backward(self, ctx, dy):
        return (None,)
