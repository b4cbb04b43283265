"""Floor: the largest integer <= x (ONNX opset 6+); piecewise constant, so the gradient is 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Floor", since=6)
class Floor(Unary):
    keep = ("x",)

    def function(self, x):
        return np.floor(x)

    def derivative(self, x, y):
        return np.zeros_like(x)
