"""Gelu: x Phi(x), exactly with erf (approximate="none") or with the tanh approximation
(approximate="tanh") (ONNX opset 20+; PyTorch's dynamo exporter writes it)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from . import _special
from ._elementwise import Unary

_SQRT_2_OVER_PI = np.sqrt(2 / np.pi)


@register("Gelu", since=20)
class Gelu(Unary):
    """ONNX Gelu-20: Gelu takes one input data (Tensor) and produces one output data (Tensor)
    where the gaussian error linear units function, $y = 0.5 * x * (1 + erf(x/sqrt(2)))$ is
    applied to the tensor elementwise."""
    attributes = {"approximate": "none"}
    keep = ("x",)

    def _check(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise ValueError(f"Gelu: approximate must be 'none' or 'tanh', got "
                             f"{self.approximate!r}")

    def function(self, x):
        self._check()
        if self.approximate == "tanh":
            return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
        # Phi(x) = erfc(-x / sqrt 2) / 2: no cancellation in 1 + erf for x < 0
        return 0.5 * x * _special.erfc(-x / np.sqrt(2))

    def derivative(self, x, y):
        if self.approximate == "tanh":
            t = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
            return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _SQRT_2_OVER_PI * (
                1 + 3 * 0.044715 * x * x)
        cdf = 0.5 * _special.erfc(-x / np.sqrt(2))
        return cdf + x * np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi)
