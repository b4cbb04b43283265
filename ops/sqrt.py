"""Sqrt (ONNX opset 6+); dy/dx = 1 / (2 sqrt(x)), read from the output."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Sqrt", since=6)
class Sqrt(Unary):
    """ONNX Sqrt-6: square root takes one input data (Tensor) and produces one output data
    (Tensor) where the square root is, y = x^0.5, is applied to the tensor elementwise."""
    def function(self, x):
        return np.sqrt(x)

    def derivative(self, x, y):
        return 0.5 / y
