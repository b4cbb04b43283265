"""Selu: gamma x for x > 0, gamma alpha (e^x - 1) otherwise (ONNX opset 6+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("Selu", since=6)
class Selu(Unary):
    """ONNX Selu-6: Selu takes one input data (Tensor) and produces one output data (Tensor)
    where the scaled exponential linear unit function, y = gamma * (alpha * e^x - alpha) for x
    <= 0, y = gamma * x for x > 0, is ..."""
    attributes = {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214050292968750}
    keep = ("x",)

    def function(self, x):
        return f32(self.gamma) * np.where(x > 0, x, f32(self.alpha) * np.expm1(np.minimum(x, 0)))

    def derivative(self, x, y):
        return f32(self.gamma) * np.where(x > 0, 1, f32(self.alpha) * np.exp(np.minimum(x, 0)))
