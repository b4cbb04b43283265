"""ThresholdedRelu: x for x > alpha, 0 otherwise (ONNX opset 10+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("ThresholdedRelu", since=10)
class ThresholdedRelu(Unary):
    """ONNX ThresholdedRelu-10: ThresholdedRelu takes one input data (Tensor) and produces one
    output data (Tensor) where the rectified linear function, y = x for x > alpha, y = 0
    otherwise, is applied to the tensor elementwise."""
    attributes = {"alpha": 1.0}
    keep = ("x",)

    def function(self, x):
        return np.where(x > f32(self.alpha), x, 0)

    def derivative(self, x, y):
        return (x > f32(self.alpha)).astype(x.dtype)
