"""Where: x where the condition holds, y elsewhere, with three-way broadcasting (ONNX opset 9+;
16 only added types). The condition gets no gradient; x and y get dy where they were chosen."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Where", since=9)
class Where(Operator):
    """ONNX Where-9: return elements, either from X or Y, depending on condition."""
    no_grad_inputs = (0,)

    def forward(self, ctx, condition, x, y):
        broadcast_shape("Where", condition, x, y)
        ctx.save(condition=condition, x_shape=x.shape, y_shape=y.shape)
        return np.where(condition, x, y)

    def backward(self, ctx, dz):
        if dz is None:
            return (None, None, None)
        zero = np.zeros((), dz.dtype)
        dx = unbroadcast(np.where(ctx.condition, dz, zero), ctx.x_shape) if ctx.needs(1) else None
        dy = unbroadcast(np.where(ctx.condition, zero, dz), ctx.y_shape) if ctx.needs(2) else None
        return (None, dx, dy)
