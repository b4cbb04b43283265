"""Exp: y = e^x (ONNX opset 6+); dy/dx = y."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Exp", since=6)
class Exp(Unary):
    """ONNX Exp-6: calculates the exponential of the given input tensor, element-wise."""
    def function(self, x):
        return np.exp(x)

    def derivative(self, x, y):
        return y
