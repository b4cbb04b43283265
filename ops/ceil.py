"""Ceil: the smallest integer >= x (ONNX opset 6+); piecewise constant, so the gradient is 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Ceil", since=6)
class Ceil(Unary):
    """ONNX Ceil-6: Ceil takes one input data (Tensor) and produces one output data (Tensor)
    where the ceil is, y = ceil(x), is applied to the tensor elementwise."""
    keep = ("x",)

    def function(self, x):
        return np.ceil(x)

    def derivative(self, x, y):
        return np.zeros_like(x)
