"""Elu: x for x > 0, alpha (e^x - 1) otherwise (ONNX opset 6+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("Elu", since=6)
class Elu(Unary):
    """ONNX Elu-6: Elu takes one input data (Tensor) and produces one output data (Tensor) where
    the function f(x) = alpha * (exp(x) - 1.) for x < 0, f(x) = x for x >= 0., is applied to the
    tensor elementwise."""
    attributes = {"alpha": 1.0}
    keep = ("x",)

    def function(self, x):
        return np.where(x > 0, x, f32(self.alpha) * np.expm1(np.minimum(x, 0)))

    def derivative(self, x, y):
        return np.where(x > 0, 1, f32(self.alpha) * np.exp(np.minimum(x, 0)))
