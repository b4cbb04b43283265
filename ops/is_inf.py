"""IsInf: which elements are +inf (``detect_positive``) or -inf (``detect_negative``), as bool
(ONNX opset 10+); not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("IsInf", since=10)
class IsInf(Operator):
    """ONNX IsInf-10: map infinity to true and other values to false."""
    attributes = {"detect_negative": 1, "detect_positive": 1}
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        pos = np.isposinf(x) if self.detect_positive else np.zeros(x.shape, bool)
        neg = np.isneginf(x) if self.detect_negative else np.zeros(x.shape, bool)
        return pos | neg

    def backward(self, ctx, dy):
        return (None,)
