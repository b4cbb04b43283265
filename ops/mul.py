"""Mul: a * b with numpy broadcasting (ONNX opset 7+)."""

from __future__ import annotations

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Mul", since=7)
class Mul(Operator):
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        # Each gradient reads the other operand only.
        ctx.save(a=a if ctx.needs(1) else None, b=b if ctx.needs(0) else None,
                 a_shape=a.shape, b_shape=b.shape)
        return a * b

    def backward(self, ctx, dy):
        da = unbroadcast(dy * ctx.b, ctx.a_shape) if ctx.needs(0) else None
        db = unbroadcast(dy * ctx.a, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)
