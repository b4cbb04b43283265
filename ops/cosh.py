"""Cosh: cosh(x) elementwise (ONNX opset 9+); dy/dx = sinh(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Cosh", since=9)
class Cosh(Unary):
    """ONNX Cosh-9: calculates the hyperbolic cosine of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.cosh(x)

    def derivative(self, x, y):
        return np.sinh(x)
