"""PRelu: x for x >= 0, slope * x otherwise; slope broadcasts to x (ONNX opset 7+; opset 6,
where a 1-D slope runs along the channel axis, is registered too)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("PRelu", since=7)
class PRelu(Operator):
    """ONNX PRelu-7: PRelu takes input data (Tensor) and slope tensor as input, and produces one
    output data (Tensor) where the function f(x) = slope * x for x < 0, f(x) = x for x >= 0., is
    applied to the data tensor ..."""
    learnable_inputs = (1,)  # the slope

    def forward(self, ctx, x, slope):
        broadcast_shape("PRelu", x, slope)
        ctx.save(x=x, slope=slope)
        return np.where(x >= 0, x, slope * x).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        x, slope = ctx.x, ctx.slope
        dx = unbroadcast(np.where(x >= 0, dy, slope * dy), x.shape) if ctx.needs(0) else None
        ds = unbroadcast(np.where(x >= 0, 0, x * dy), slope.shape) if ctx.needs(1) else None
        return (dx, ds)


@register("PRelu", since=6)
class PRelu6(PRelu):
    """Opset 6: a 1-D slope of C values applies per channel (axis 1) of an (N, C, ...) input,
    as PyTorch's exporter wrote nn.PReLU(C)."""

    def forward(self, ctx, x, slope):
        ctx.save(slope6_shape=slope.shape)
        if slope.ndim == 1 and x.ndim > 2 and slope.size == x.shape[1] > 1:
            slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
        return super().forward(ctx, x, slope)

    def backward(self, ctx, dy):
        dx, ds = super().backward(ctx, dy)
        return dx, None if ds is None else ds.reshape(ctx.slope6_shape)
