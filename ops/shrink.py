"""Shrink: x - bias for x > lambd, x + bias for x < -lambd, else 0 (ONNX opset 9+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("Shrink", since=9)
class Shrink(Unary):
    """ONNX Shrink-9: Shrink takes one input data (Tensor) and produces one Tensor output,
    having same datatype and shape with input."""
    attributes = {"bias": 0.0, "lambd": 0.5}
    keep = ("x",)

    def function(self, x):
        lambd, bias = f32(self.lambd), f32(self.bias)
        return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))

    def derivative(self, x, y):
        return (np.abs(x) > f32(self.lambd)).astype(x.dtype)
