"""Abs: |x| (ONNX opset 6+; 13 only added bfloat16); dy/dx = sign(x)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Abs", since=6)
class Abs(Unary):
    """ONNX Abs-6: absolute takes one input data (Tensor) and produces one output data (Tensor)
    where the absolute is, y = abs(x), is applied to the tensor elementwise."""
    keep = ("x",)

    def function(self, x):
        return np.abs(x)

    def derivative(self, x, y):
        return np.sign(x)
