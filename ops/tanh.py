"""Tanh (ONNX opset 6+); dy/dx = 1 - y^2."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary


@register("Tanh", since=6)
class Tanh(Unary):
    def function(self, x):
        return np.tanh(x)

    def derivative(self, x, y):
        return 1 - y * y
