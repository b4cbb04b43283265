"""Asinh: arcsinh(x) elementwise (ONNX opset 9+); dy/dx = 1 / sqrt(square(x) + 1)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Asinh", since=9)
class Asinh(Unary):
    """ONNX Asinh-9: calculates the hyperbolic arcsine of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arcsinh(x)

    def derivative(self, x, y):
        return 1 / np.sqrt(np.square(x) + 1)
