"""LpNormalization: x divided by its L1 or L2 norm along ``axis`` (ONNX opset 1+); a zero norm
gives 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("LpNormalization", since=1)
class LpNormalization(Operator):
    """ONNX LpNormalization-1: given a matrix, apply Lp-normalization along the provided axis."""
    attributes = {"axis": -1, "p": 2}

    def forward(self, ctx, x):
        axis = normalize_axis(self.axis, x.ndim, "LpNormalization")
        if self.p == 1:
            norm = np.sum(np.abs(x), axis=axis, keepdims=True)
        elif self.p == 2:
            norm = np.sqrt(np.sum(x * x, axis=axis, keepdims=True))
        else:
            raise ValueError(f"LpNormalization: p must be 1 or 2, got {self.p}")
        safe = np.where(norm == 0, 1, norm)
        y = np.where(norm == 0, 0, x / safe).astype(x.dtype, copy=False)
        ctx.save(axis=axis, y=y, norm=safe, x=x)
        return y

    def backward(self, ctx, dy):
        y, axis = ctx.y, ctx.axis
        inner = np.sum(dy * y, axis=axis, keepdims=True)
        direction = y if self.p == 2 else np.sign(ctx.x)
        return ((dy - direction * inner) / ctx.norm,)
