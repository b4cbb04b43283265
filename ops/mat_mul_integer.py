"""MatMulInteger (ONNX opset 10+): ``(A - a_zero_point) @ (B - b_zero_point)`` of 8-bit
integers, in int32 (a_zero_point per row of A or scalar, b_zero_point per column of B or
scalar). Integer in, integer out: no gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def shifted(x: np.ndarray, zero_point, per_row: bool) -> np.ndarray:
    x = x.astype(np.int32)
    if zero_point is None:
        return x
    zp = np.asarray(zero_point).astype(np.int32)
    if zp.ndim == 1 and zp.size > 1 and per_row:  # one per row of A: (..., M, 1)
        zp = zp.reshape(-1, 1)
    return x - zp


@register("MatMulInteger", since=10)
class MatMulInteger(Operator):
    """ONNX MatMulInteger-10: matrix product that behaves like numpy.matmul."""
    no_grad_inputs = (0, 1, 2, 3)

    def forward(self, ctx, a, b, a_zero_point=None, b_zero_point=None):
        return np.matmul(shifted(a, a_zero_point, True), shifted(b, b_zero_point, False))

    def backward(self, ctx, dy):
        return (None, None, None, None)
