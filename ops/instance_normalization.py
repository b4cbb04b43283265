"""InstanceNormalization: standardise each (sample, channel) over the spatial axes, then a
per-channel scale and bias (ONNX opset 6+)."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._elementwise import f32
from ._normalize import standardize, standardize_backward


@register("InstanceNormalization", since=6)
class InstanceNormalization(Operator):
    """ONNX InstanceNormalization-6: carries out instance normalization as described in the
    paper https://arxiv.org/abs/1607.08022."""
    learnable_inputs = (1, 2)  # scale and bias
    attributes = {"epsilon": 1e-5}

    def forward(self, ctx, x, scale, bias):
        if x.ndim < 3 or scale.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
            raise ValueError(f"InstanceNormalization: X {list(x.shape)} must be (N, C, ...) "
                             f"with scale {list(scale.shape)} and B {list(bias.shape)} of (C,)")
        axes = tuple(range(2, x.ndim))
        xhat, _, inv_std = standardize(x, axes, f32(self.epsilon))
        shape = (-1,) + (1,) * (x.ndim - 2)
        ctx.save(axes=axes, xhat=xhat, inv_std=inv_std, scale=scale.reshape(shape))
        return (xhat * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        xhat, summed = ctx.xhat, (0, *ctx.axes)
        dx = standardize_backward(dy * ctx.scale, xhat, ctx.inv_std, ctx.axes) \
            if ctx.needs(0) else None
        dscale = (dy * xhat).sum(axis=summed) if ctx.needs(1) else None
        dbias = dy.sum(axis=summed) if ctx.needs(2) else None
        return (dx, dscale, dbias)
