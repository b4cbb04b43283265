"""QLinearMatMul (ONNX opsets 10+; 21 widened types): a matrix product of quantized tensors,
requantized: ``saturate(round((A - a_zp) @ (B - b_zp) * a_scale * b_scale / y_scale) +
y_zp)``, as onnx.reference computes it (the product in int32). Not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._quantize import saturate
from .mat_mul_integer import shifted


@register("QLinearMatMul", since=10)
class QLinearMatMul(Operator):
    """ONNX QLinearMatMul-10: matrix product that behaves like numpy.matmul."""
    no_grad_inputs = tuple(range(8))

    def forward(self, ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                y_zero_point):
        product = np.matmul(shifted(a, a_zero_point, True), shifted(b, b_zero_point, False))
        y = product * (a_scale * b_scale / y_scale)
        if y_zero_point is not None:
            y = y + y_zero_point
        dtype = a.dtype if y_zero_point is None else y_zero_point.dtype
        return saturate(y, dtype)

    def backward(self, ctx, dy):
        return (None,) * 8
