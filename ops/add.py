"""Add: a + b with numpy broadcasting (ONNX opset 7+; opset 6's
``broadcast``/``axis`` form through ops/_legacy.py)."""

from __future__ import annotations

from meta.lv0 import Operator, native, register, unbroadcast

from ._elementwise import broadcast_shape, contiguous
from ._legacy import LegacyBroadcast


@register("Add", since=7)
class Add(Operator):
    """ONNX Add-7: performs element-wise binary addition (with Numpy-style broadcasting
    support)."""
    learnable_inputs = (0, 1)  # a bias, a position embedding
    def forward(self, ctx, a, b):
        broadcast_shape(self.op_type, a, b)
        ctx.save(a_shape=a.shape, b_shape=b.shape)
        return a + b

    def backward(self, ctx, dy):
        da = unbroadcast(dy, ctx.a_shape) if ctx.needs(0) else None
        db = unbroadcast(dy, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)


@register("Add", since=7, backend="native")
class NativeAdd(Add):
    """The same operator through cpp/include/meta/elementwise.hpp: a broadcast loop nest
    forward, one reducing pass per broadcast input backward (e.g. a bias's gradient)."""

    def forward(self, ctx, a, b):
        if not native.supports(a, b):
            return super().forward(ctx, a, b)
        broadcast_shape(self.op_type, a, b)
        ctx.save(a_shape=a.shape, b_shape=b.shape)
        return native.module().add_forward(contiguous(a), contiguous(b))

    def backward(self, ctx, dy):
        if not native.supports(dy):
            return super().backward(ctx, dy)
        da = reduce_to(dy, ctx.a_shape) if ctx.needs(0) else None
        db = reduce_to(dy, ctx.b_shape) if ctx.needs(1) else None
        return (da, db)


def reduce_to(dy, shape):
    """unbroadcast(dy, shape) in one native pass; dy itself when nothing is broadcast."""
    if dy.shape == tuple(shape):
        return dy
    return native.module().unbroadcast_sum(contiguous(dy), tuple(shape))


@register("Add", since=6)
class Add6(LegacyBroadcast, Add):
    """Opset 6: B broadcasts only with ``broadcast=1``, aligned at ``axis`` (ops/_legacy.py)."""
