"""Atanh: arctanh(x) elementwise (ONNX opset 9+); dy/dx = 1 / (1 - square(x))."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Atanh", since=9)
class Atanh(Unary):
    """ONNX Atanh-9: calculates the hyperbolic arctangent of the given input tensor
    element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arctanh(x)

    def derivative(self, x, y):
        return 1 / (1 - np.square(x))
