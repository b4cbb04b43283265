"""Add: a + b with numpy broadcasting (ONNX opset 7+)."""

from __future__ import annotations

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Add", since=7)
class Add(Operator):
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        ctx.save(a_shape=a.shape, b_shape=b.shape)
        return a + b

    def backward(self, ctx, dy):
        da = unbroadcast(dy, ctx.a_shape) if ctx.needs(0) else None
        db = unbroadcast(dy, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)
