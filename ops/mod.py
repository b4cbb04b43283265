"""Mod: the remainder of a / b with broadcasting (ONNX opset 10+).

``fmod=0`` takes the divisor's sign (Python's %, what PyTorch's exporter writes for integer
``%``); ``fmod=1`` the dividend's (C's fmod). Float inputs work with either. The gradient is
dy for a and -dy * q for b, q the integer quotient the remainder implies.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Mod", since=10)
class Mod(Operator):
    """ONNX Mod-10: performs element-wise binary modulus (with Numpy-style broadcasting
    support)."""
    attributes = {"fmod": 0}

    def forward(self, ctx, a, b):
        broadcast_shape("Mod", a, b)
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.fmod(a, b) if self.fmod else np.mod(a, b)
        ctx.save(a=a, b=b)
        return y.astype(np.result_type(a, b), copy=False)

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        a, b = ctx.a, ctx.b
        quotient = np.trunc(a / b) if self.fmod else np.floor(a / b)
        da = unbroadcast(dy, a.shape) if ctx.needs(0) else None
        db = unbroadcast(-dy * quotient, b.shape) if ctx.needs(1) else None
        return (da, db)
