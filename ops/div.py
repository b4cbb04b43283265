"""Div: a / b with numpy broadcasting (ONNX opset 7+); integers divide truncating toward 0."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Div", since=7)
class Div(Operator):
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
