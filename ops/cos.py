"""Cos: cos(x) elementwise (ONNX opset 7+); dy/dx = -sin(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Cos", since=7)
class Cos(Unary):
    """ONNX Cos-7: calculates the cosine of the given input tensor, element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.cos(x)

    def derivative(self, x, y):
        return -np.sin(x)
