"""Sub: a - b with numpy broadcasting (ONNX opset 7+; opset 6's
``broadcast``/``axis`` form through ops/_legacy.py)."""

from __future__ import annotations

from meta.lv0 import Operator, native, register, unbroadcast

from ._elementwise import broadcast_shape, contiguous
from ._legacy import LegacyBroadcast
from .add import reduce_to


@register("Sub", since=7)
class Sub(Operator):
    """ONNX Sub-7: performs element-wise binary subtraction (with Numpy-style broadcasting
    support)."""
    learnable_inputs = (0, 1)  # a bias
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        ctx.save(a_shape=a.shape, b_shape=b.shape)
        return a - b

    def backward(self, ctx, dy):
        da = unbroadcast(dy, ctx.a_shape) if ctx.needs(0) else None
        db = -unbroadcast(dy, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)


@register("Sub", since=7, backend="native")
class NativeSub(Sub):
    """The same operator through cpp/include/meta/elementwise.hpp (see NativeAdd)."""

    def forward(self, ctx, a, b):
        if not native.supports(a, b):
            return super().forward(ctx, a, b)
        broadcast_shape(self.op_type, a, b)
        ctx.save(a_shape=a.shape, b_shape=b.shape)
        return native.module().sub_forward(contiguous(a), contiguous(b))

    def backward(self, ctx, dy):
        if not native.supports(dy):
            return super().backward(ctx, dy)
        da = reduce_to(dy, ctx.a_shape) if ctx.needs(0) else None
        db = -reduce_to(dy, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)


@register("Sub", since=6)
class Sub6(LegacyBroadcast, Sub):
    """Opset 6: B broadcasts only with ``broadcast=1``, aligned at ``axis`` (ops/_legacy.py)."""
