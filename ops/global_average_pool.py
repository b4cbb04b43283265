"""GlobalAveragePool (ONNX opset 1+): the mean over all spatial dims, kept as size-1 dims."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("GlobalAveragePool", since=1)
class GlobalAveragePool(Operator):
    """ONNX GlobalAveragePool-1: GlobalAveragePool consumes an input tensor X and applies
    average pooling across the values in the same channel."""
    def forward(self, ctx, x):
        if x.ndim < 3:
            raise ValueError(f"GlobalAveragePool: X {list(x.shape)} needs spatial dims "
                             f"(N, C, d1, ...)")
        ctx.save(shape=x.shape)
        return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)

    def backward(self, ctx, dy):
        count = int(np.prod(ctx.shape[2:]))
        return (np.broadcast_to(dy / count, ctx.shape).copy(),)
