"""Swish: x sigmoid(alpha x) (ONNX opset 24+); dy/dx = s + alpha x s (1 - s)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


def _sigmoid(z):
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1 / (1 + e), e / (1 + e))


@register("Swish", since=24)
class Swish(Unary):
    """ONNX Swish-24: Swish function takes one input data (Tensor) and produces one output data
    (Tensor) of the same shape, where $Swish(x) = x * sigmoid(alpha * x)$."""
    attributes = {"alpha": 1.0}
    keep = ("x",)

    def function(self, x):
        return x * _sigmoid(f32(self.alpha) * x)

    def derivative(self, x, y):
        a = f32(self.alpha)
        s = _sigmoid(a * x)
        return s + a * x * s * (1 - s)
