"""Round: to the nearest integer, halves to even (ONNX opset 11+); the gradient is 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Round", since=11)
class Round(Unary):
    """ONNX Round-11: Round takes one input Tensor and rounds the values, element-wise, meaning
    it finds the nearest integer for each value."""
    keep = ("x",)

    def function(self, x):
        return np.round(x)

    def derivative(self, x, y):
        return np.zeros_like(x)
