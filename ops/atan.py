"""Atan: arctan(x) elementwise (ONNX opset 7+); dy/dx = 1 / (1 + square(x))."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Atan", since=7)
class Atan(Unary):
    """ONNX Atan-7: calculates the arctangent (inverse of tangent) of the given input tensor,
    element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arctan(x)

    def derivative(self, x, y):
        return 1 / (1 + np.square(x))
