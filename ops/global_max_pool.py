"""GlobalMaxPool: the maximum over all spatial axes, kept as size 1 (ONNX opset 1+); ties
share the gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("GlobalMaxPool", since=1)
class GlobalMaxPool(Operator):
    """ONNX GlobalMaxPool-1: GlobalMaxPool consumes an input tensor X and applies max pooling
    across the values in the same channel."""
    def forward(self, ctx, x):
        axes = tuple(range(2, x.ndim))
        y = np.max(x, axis=axes, keepdims=True)
        ctx.save(x=x, y=y, axes=axes)
        return y

    def backward(self, ctx, dy):
        hit = ctx.x == ctx.y
        return (dy * hit / hit.sum(axis=ctx.axes, keepdims=True),)
