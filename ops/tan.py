"""Tan: tan(x) elementwise (ONNX opset 7+); dy/dx = 1 + square(y)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Tan", since=7)
class Tan(Unary):
    """ONNX Tan-7: calculates the tangent of the given input tensor, element-wise."""
    keep = ("x", "y")

    def function(self, x):
        return np.tan(x)

    def derivative(self, x, y):
        return 1 + np.square(y)
