"""Log: natural logarithm (ONNX opset 6+); dy/dx = 1/x."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Log", since=6)
class Log(Unary):
    """ONNX Log-6: calculates the natural log of the given input tensor, element-wise."""
    keep = ("x",)

    def function(self, x):
        return np.log(x)

    def derivative(self, x, y):
        return 1 / x
