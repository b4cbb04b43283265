"""Div: a / b with numpy broadcasting (ONNX opset 7+); integers divide truncating toward 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, native, register, unbroadcast

from ._elementwise import broadcast_shape, contiguous
from ._legacy import LegacyBroadcast


@register("Div", since=7)
class Div(Operator):
    """ONNX Div-7: performs element-wise binary division (with Numpy-style broadcasting
    support)."""
    learnable_inputs = ()  # a divisor is a setting, not a learned value
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        if np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer):
            # C-style division, as ONNX specifies: a - fmod(a, b) is an exact multiple of b.
            y = (a - np.fmod(a, b)) // b
        else:
            y = (a / b).astype(a.dtype, copy=False)
        ctx.save(b=b, y=y if ctx.needs(1) else None, a_shape=a.shape)
        return y

    def backward(self, ctx, dy):
        b = ctx.b
        da = unbroadcast(dy / b, ctx.a_shape) if ctx.needs(0) else None
        # d(a/b)/db = -a / b^2 = -y / b
        db = unbroadcast(-dy * ctx.y / b, b.shape) if ctx.needs(1) else None
        return (da, db)


@register("Div", since=7, backend="native")
class NativeDiv(Div):
    """The same operator through cpp/include/meta/elementwise.hpp (floats; integer division
    stays numpy's): backward divides and sums over the broadcast axes in one pass."""

    def forward(self, ctx, a, b):
        if not native.supports(a, b):
            return super().forward(ctx, a, b)
        broadcast_shape(self.op_type, a, b)
        b = contiguous(b)
        y = native.module().div_forward(contiguous(a), b)
        ctx.save(b=b, y=y if ctx.needs(1) else None, a_shape=a.shape)
        return y

    def backward(self, ctx, dy):
        if not native.supports(dy, ctx.b) or (ctx.y is not None and ctx.y.dtype != dy.dtype):
            return super().backward(ctx, dy)
        m, b, dy = native.module(), contiguous(ctx.b), contiguous(dy)
        da = m.unbroadcast_div(dy, b, ctx.a_shape) if ctx.needs(0) else None
        db = m.unbroadcast_div_denominator(dy, b, ctx.y, b.shape) if ctx.needs(1) else None
        return (da, db)


@register("Div", since=6)
class Div6(LegacyBroadcast, Div):
    """Opset 6: B broadcasts only with ``broadcast=1``, aligned at ``axis`` (ops/_legacy.py)."""
