"""Gemm: Y = alpha * A' B' + beta * C, A' and B' optionally transposed (ONNX opset 11+)."""

from __future__ import annotations

from meta.lv0 import Operator, register, unbroadcast


@register("Gemm", since=11)
class Gemm(Operator):
    attributes = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}

    def operands(self, a, b):
        return (a.T if self.transA else a), (b.T if self.transB else b)

    def forward(self, ctx, a, b, c=None):
        a_, b_ = self.operands(a, b)
        y = a_ @ b_
        if self.alpha != 1.0:
            y *= self.alpha
        if c is not None:
            y += self.beta * c if self.beta != 1.0 else c
        ctx.save(a=a, b=b, c_shape=None if c is None else c.shape)
        return y

    def backward(self, ctx, dy):
        a_, b_ = self.operands(ctx.a, ctx.b)
        g = dy * self.alpha if self.alpha != 1.0 else dy
        da = db = dc = None
        # dA' = g B'^T and dB' = A'^T g; a transposed operand gets the transposed product,
        # computed directly so the result is contiguous.
        if ctx.needs(0):
            da = b_ @ g.T if self.transA else g @ b_.T
        if ctx.needs(1):
            db = g.T @ a_ if self.transB else a_.T @ g
        if ctx.c_shape is not None and ctx.needs(2):
            dc = unbroadcast(dy * self.beta if self.beta != 1.0 else dy, ctx.c_shape)
        return (da, db, dc)
