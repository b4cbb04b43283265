"""Softsign: x / (1 + |x|) (ONNX opset 1+); dy/dx = 1 / (1 + |x|)^2."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Softsign", since=1)
class Softsign(Unary):
    """ONNX Softsign-1: calculates the softsign (x/(1+|x|)) of the given input tensor
    element-wise."""
    keep = ("x",)

    def function(self, x):
        return x / (1 + np.abs(x))

    def derivative(self, x, y):
        return 1 / np.square(1 + np.abs(x))
