"""Mish: x tanh(softplus(x)) (ONNX opset 18+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Mish", since=18)
class Mish(Unary):
    """ONNX Mish-18: Mish."""
    keep = ("x",)

    def function(self, x):
        return x * np.tanh(np.logaddexp(0, x))

    def derivative(self, x, y):
        t = np.tanh(np.logaddexp(0, x))
        return t + x * np.exp(-np.logaddexp(0, -x)) * (1 - t * t)
