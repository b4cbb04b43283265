"""Sin: sin(x) elementwise (ONNX opset 7+); dy/dx = cos(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Sin", since=7)
class Sin(Unary):
    keep = ("x",)

    def function(self, x):
        return np.sin(x)

    def derivative(self, x, y):
        return np.cos(x)
