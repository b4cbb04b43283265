"""Acos: arccos(x) elementwise (ONNX opset 7+); dy/dx = -1 / sqrt(1 - square(x))."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Acos", since=7)
class Acos(Unary):
    """ONNX Acos-7: calculates the arccosine (inverse of cosine) of the given input tensor,
    element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arccos(x)

    def derivative(self, x, y):
        return -1 / np.sqrt(1 - np.square(x))
