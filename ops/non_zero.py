"""NonZero: the indices of non-zero elements, (rank, count) int64, in row-major order
(ONNX opset 9+; 13 only added types); no gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("NonZero", since=9)
class NonZero(Operator):
    """ONNX NonZero-9: returns the indices of the elements that are non-zero (in row-major order
    - by dimension)."""
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        if x.ndim == 0:  # a scalar: one index tuple of length 0 when it is non-zero
            return np.zeros((0, int(bool(x))), dtype=np.int64)
        return np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)

    def backward(self, ctx, dy):
        return (None,)
