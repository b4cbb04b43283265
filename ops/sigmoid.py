"""Sigmoid: 1 / (1 + e^-x) (ONNX opset 6+); dy/dx = y (1 - y)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._elementwise import NativeUnary, Unary


@register("Sigmoid", since=6)
class Sigmoid(Unary):
    """ONNX Sigmoid-6: Sigmoid takes one input data (Tensor) and produces one output data
    (Tensor) where the sigmoid function, y = 1 / (1 + exp(-x)), is applied to the tensor
    elementwise."""
    def function(self, x):
        # e^-|x| never overflows, and each branch keeps full relative precision.
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))

    def derivative(self, x, y):
        return y * (1 - y)


@register("Sigmoid", since=6, backend="native")
class NativeSigmoid(NativeUnary, Sigmoid):
    """The same operator through cpp/include/meta/activations.hpp (one pass each way)."""

    kernel = "sigmoid"

    def forward(self, ctx, x):
        # Measured slower than numpy's (AVX-512 exp) forward at 128x512 float32, so only the
        # fused one-pass backward is native.
        return Sigmoid.forward(self, ctx, x)
