"""Asin: arcsin(x) elementwise (ONNX opset 7+); dy/dx = 1 / sqrt(1 - square(x))."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Asin", since=7)
class Asin(Unary):
    """ONNX Asin-7: calculates the arcsine (inverse of sine) of the given input tensor,
    element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arcsin(x)

    def derivative(self, x, y):
        return 1 / np.sqrt(1 - np.square(x))
