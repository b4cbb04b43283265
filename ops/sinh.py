"""Sinh: sinh(x) elementwise (ONNX opset 9+); dy/dx = cosh(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Sinh", since=9)
class Sinh(Unary):
    """ONNX Sinh-9: calculates the hyperbolic sine of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.sinh(x)

    def derivative(self, x, y):
        return np.cosh(x)
