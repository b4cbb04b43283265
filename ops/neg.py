"""Neg: -x (ONNX opset 6+); dy/dx = -1."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Neg", since=6)
class Neg(Unary):
    """ONNX Neg-6: Neg takes one input data (Tensor) and produces one output data (Tensor) where
    each element flipped sign, y = -x, is applied to the tensor elementwise."""
    keep = ("x",)

    def function(self, x):
        return np.negative(x)

    def derivative(self, x, y):
        return -np.ones_like(x)
