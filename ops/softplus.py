"""Softplus: log(1 + e^x) (ONNX opset 1+), without overflow; dy/dx = sigmoid(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Softplus", since=1)
class Softplus(Unary):
    """ONNX Softplus-1: Softplus takes one input data (Tensor) and produces one output data
    (Tensor) where the softplus function, y = ln(exp(x) + 1), is applied to the tensor
    elementwise."""
    keep = ("x",)

    def function(self, x):
        return np.logaddexp(0, x)

    def derivative(self, x, y):
        return np.exp(-np.logaddexp(0, -x))
