"""Det: the determinant of each square matrix in the last two axes (ONNX opset 11+);
d det / dX = det * inv(X)^T."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Det", since=11)
class Det(Operator):
    """ONNX Det-11: Det calculates determinant of a square matrix or batches of square matrices."""
    def forward(self, ctx, x):
        y = np.linalg.det(x).astype(x.dtype)
        ctx.save(x=x, y=y)
        return np.asarray(y)

    def backward(self, ctx, dy):
        inv_t = np.swapaxes(np.linalg.inv(ctx.x), -1, -2)
        return ((dy * ctx.y)[..., None, None] * inv_t,)
