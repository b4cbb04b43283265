"""Sin: sin(x) elementwise (ONNX opset 7+); dy/dx = cos(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Sin", since=7)
class Sin(Unary):
    """ONNX Sin-7: calculates the sine of the given input tensor, element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.sin(x)

    def derivative(self, x, y):
        return np.cos(x)
