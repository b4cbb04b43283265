"""Celu: max(0, x) + min(0, alpha (e^(x/alpha) - 1)) (ONNX opset 12+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("Celu", since=12)
class Celu(Unary):
    """ONNX Celu-12: continuously Differentiable Exponential Linear Units."""
    attributes = {"alpha": 1.0}
    keep = ("x",)

    def function(self, x):
        return np.maximum(x, 0) + f32(self.alpha) * np.expm1(np.minimum(x, 0) / f32(self.alpha))

    def derivative(self, x, y):
        return np.where(x > 0, 1, np.exp(np.minimum(x, 0) / f32(self.alpha)))
