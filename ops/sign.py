"""Sign: -1, 0 or 1 (ONNX opset 9+; any numeric type); the gradient is 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Sign", since=9)
class Sign(Unary):
    """ONNX Sign-9: calculate the sign of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.sign(x)

    def derivative(self, x, y):
        return np.zeros_like(x)
