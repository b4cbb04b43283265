"""Acosh: arccosh(x) elementwise (ONNX opset 9+); dy/dx = 1 / sqrt(square(x) - 1)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Acosh", since=9)
class Acosh(Unary):
    """ONNX Acosh-9: calculates the hyperbolic arccosine of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.arccosh(x)

    def derivative(self, x, y):
        return 1 / np.sqrt(np.square(x) - 1)
