"""IsNaN: which elements are NaN, as bool (ONNX opset 9+); not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("IsNaN", since=9)
class IsNaN(Operator):
    """ONNX IsNaN-9: returns which elements of the input are NaN."""
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        return np.isnan(x)

    def backward(self, ctx, dy):
        return (None,)
