"""Mul: a * b with numpy broadcasting (ONNX opset 7+; opset 6's
``broadcast``/``axis`` form through ops/_legacy.py)."""

from __future__ import annotations

from meta.lv0 import Operator, native, register, unbroadcast

from ._elementwise import broadcast_shape, contiguous
from ._legacy import LegacyBroadcast


@register("Mul", since=7)
class Mul(Operator):
    """ONNX Mul-7: performs element-wise binary multiplication (with Numpy-style broadcasting
    support)."""
    learnable_inputs = (0, 1)  # a scale vector (LayerScale, RMSNorm written out)
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


@register("Mul", since=7, backend="native")
class NativeMul(Mul):
    """The same operator through cpp/include/meta/elementwise.hpp: backward multiplies and
    sums over the broadcast axes in one pass, with no full-size temporary."""

    def forward(self, ctx, a, b):
        if not native.supports(a, b):
            return super().forward(ctx, a, b)
        broadcast_shape(self.op_type, a, b)
        a, b = contiguous(a), contiguous(b)
        ctx.save(a=a if ctx.needs(1) else None, b=b if ctx.needs(0) else None,
                 a_shape=a.shape, b_shape=b.shape)
        return native.module().mul_forward(a, b)

    def backward(self, ctx, dy):
        others = [x for x in (ctx.a, ctx.b) if x is not None]
        if not native.supports(dy, *others):
            return super().backward(ctx, dy)
        kernel, dy = native.module().unbroadcast_mul, contiguous(dy)
        da = kernel(dy, contiguous(ctx.b), ctx.a_shape) if ctx.needs(0) else None
        db = kernel(dy, contiguous(ctx.a), ctx.b_shape) if ctx.needs(1) else None
        return (da, db)


@register("Mul", since=6)
class Mul6(LegacyBroadcast, Mul):
    """Opset 6: B broadcasts only with ``broadcast=1``, aligned at ``axis`` (ops/_legacy.py)."""
