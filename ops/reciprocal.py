"""Reciprocal: 1 / x (ONNX opset 6+); dy/dx = -y^2."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Reciprocal", since=6)
class Reciprocal(Unary):
    """ONNX Reciprocal-6: Reciprocal takes one input data (Tensor) and produces one output data
    (Tensor) where the reciprocal is, y = 1/x, is applied to the tensor elementwise."""
    keep = ("y",)

    def function(self, x):
        return np.reciprocal(x)

    def derivative(self, x, y):
        return -np.square(y)
