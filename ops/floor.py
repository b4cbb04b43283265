"""Floor: the largest integer <= x (ONNX opset 6+); piecewise constant, so the gradient is 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Floor", since=6)
class Floor(Unary):
    """ONNX Floor-6: Floor takes one input data (Tensor) and produces one output data (Tensor)
    where the floor is, y = floor(x), is applied to the tensor elementwise."""
    keep = ("x",)

    def function(self, x):
        return np.floor(x)

    def derivative(self, x, y):
        return np.zeros_like(x)
