"""MeanVarianceNormalization: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over ``axes``
(ONNX opset 9+; 13 only added types), as its ONNX function body computes it."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axes
from ._elementwise import f32

EPSILON = f32(1e-9)


@register("MeanVarianceNormalization", since=9)
class MeanVarianceNormalization(Operator):
    """ONNX MeanVarianceNormalization-9: A MeanVarianceNormalization Function."""
    attributes = {"axes": [0, 2, 3]}

    def forward(self, ctx, x):
        axes = normalize_axes(self.axes, x.ndim, "MeanVarianceNormalization")
        mean = np.mean(x, axis=axes, keepdims=True)
        std = np.sqrt(np.mean(x * x, axis=axes, keepdims=True) - mean * mean)
        denominator = std + np.asarray(EPSILON, x.dtype)
        centered = x - mean
        ctx.save(axes=axes, centered=centered, std=std, denominator=denominator)
        return (centered / denominator).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        axes, c, s, d = ctx.axes, ctx.centered, ctx.std, ctx.denominator
        mean = lambda v: np.mean(v, axis=axes, keepdims=True)  # noqa: E731
        with np.errstate(divide="ignore", invalid="ignore"):
            spread = np.where(s == 0, 0, mean(dy * c) / (d * d * np.where(s == 0, 1, s)))
        return ((dy - mean(dy)) / d - c * spread,)
