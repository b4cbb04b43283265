"""Not: logical negation of a bool tensor (ONNX opset 1+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Not", since=1)
class Not(Operator):
    """ONNX Not-1: returns the negation of the input tensor element-wise."""
    def forward(self, ctx, x):
        return np.logical_not(x)

    def backward(self, ctx, dy):
        return (None,)
