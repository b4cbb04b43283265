"""HardSwish: x max(0, min(1, alpha x + 1/2)) with alpha = 1/6 as float32, as ONNX's function
body (HardSigmoid, then Mul) computes it (ONNX opset 14+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32

ALPHA = f32(1 / 6)


@register("HardSwish", since=14)
class HardSwish(Unary):
    """ONNX HardSwish-14: HardSwish takes one input data (Tensor) and produces one output data
    (Tensor) where the HardSwish function, y = x * max(0, min(1, alpha * x + beta)) = x *
    HardSigmoid(x), where alpha = 1/6 and beta = ..."""
    keep = ("x",)

    def function(self, x):
        return x * np.clip(x * ALPHA + 0.5, 0, 1)

    def derivative(self, x, y):
        z = x * ALPHA + 0.5
        return np.where(z >= 1, 1, np.where(z <= 0, 0, 2 * ALPHA * x + 0.5))
