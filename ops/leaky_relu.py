"""LeakyRelu: y = x for x >= 0, alpha * x otherwise (ONNX opset 6+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import NativeUnary, Unary


@register("LeakyRelu", since=6)
class LeakyRelu(Unary):
    """ONNX LeakyRelu-6: LeakyRelu takes input data (Tensor) and an argument alpha, and produces
    one output data (Tensor) where the function f(x) = alpha * x for x < 0, f(x) = x for x >= 0,
    is applied to the data tensor ..."""
    attributes = {"alpha": 0.01}
    keep = ("x",)

    @property
    def slope(self) -> float:
        # ONNX float attributes are float32: round, so a graph built in code computes what the
        # same graph loaded from a file computes.
        return float(np.float32(self.alpha))

    def function(self, x):
        return np.where(x >= 0, x, self.slope * x)

    def derivative(self, x, y):
        return np.where(x >= 0, 1.0, self.slope)


@register("LeakyRelu", since=6, backend="native")
class NativeLeakyRelu(NativeUnary, LeakyRelu):
    """The same operator through cpp/include/meta/activations.hpp."""

    kernel = "leaky_relu"

    def options(self) -> dict:
        return {"slope": self.slope}
