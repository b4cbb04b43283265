"""HardSigmoid: max(0, min(1, alpha x + beta)) (ONNX opset 6+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import Unary, f32


@register("HardSigmoid", since=6)
class HardSigmoid(Unary):
    """ONNX HardSigmoid-6: HardSigmoid takes one input data (Tensor) and produces one output
    data (Tensor) where the HardSigmoid function, y = max(0, min(1, alpha * x + beta)), is
    applied to the tensor elementwise."""
    attributes = {"alpha": 0.2, "beta": 0.5}
    keep = ("x",)

    def function(self, x):
        return np.clip(f32(self.alpha) * x + f32(self.beta), 0, 1)

    def derivative(self, x, y):
        z = f32(self.alpha) * x + f32(self.beta)
        return np.where((z > 0) & (z < 1), f32(self.alpha), 0)
