"""Pow: a ** b with numpy broadcasting (ONNX opset 7+); the output has the base's type."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape
from ._legacy import LegacyBroadcast


@register("Pow", since=7)
class Pow(Operator):
    """ONNX Pow-7: Pow takes input data (Tensor) and exponent Tensor, and produces one output
    data (Tensor) where the function f(x) = x^exponent, is applied to the data tensor
    elementwise."""
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        y = np.power(a, b).astype(a.dtype, copy=False)
        ctx.save(a=a, b=b, y=y)
        return y

    def backward(self, ctx, dy):
        a, b, y = ctx.a, ctx.b, ctx.y
        da = db = None
        if ctx.needs(0) and np.issubdtype(a.dtype, np.floating):
            da = unbroadcast(dy * b * np.power(a, b - 1), a.shape).astype(a.dtype, copy=False)
        if ctx.needs(1) and np.issubdtype(b.dtype, np.floating):
            # d(a^b)/db = a^b ln a: 0 where a == 0 (the limit for b > 0), nan for a < 0.
            with np.errstate(invalid="ignore"):
                log_a = np.log(np.where(a == 0, 1, a))
            db = unbroadcast(dy * y * log_a, b.shape).astype(b.dtype, copy=False)
        return (da, db)


@register("Pow", since=1)
class Pow1(LegacyBroadcast, Pow):
    """Opsets 1-6: the exponent broadcasts only with ``broadcast=1``, aligned at ``axis``
    (ops/_legacy.py)."""
