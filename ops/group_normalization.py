"""GroupNormalization: standardise each sample's channel groups over (channels of the group,
spatial axes), then scale and shift (ONNX opset 21+: per-channel scale and bias; opset 18:
per-group scale and bias)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._elementwise import f32
from ._normalize import standardize, standardize_backward


@register("GroupNormalization", since=21)
class GroupNormalization(Operator):
    """ONNX GroupNormalization-21: A GroupNormalization function."""
    learnable_inputs = (1, 2)  # scale and bias
    attributes = {"epsilon": 1e-5, "num_groups": None, "stash_type": 1}
    per_channel = True

    def forward(self, ctx, x, scale, bias):
        n, c, g = x.shape[0], x.shape[1], int(self.num_groups)
        want = c if self.per_channel else g
        if x.ndim < 3 or c % g or scale.shape != (want,) or bias.shape != (want,):
            raise ValueError(f"GroupNormalization: X {list(x.shape)} with num_groups={g} needs "
                             f"scale and B of ({want},), got {list(scale.shape)}, "
                             f"{list(bias.shape)}")
        grouped = x.reshape(n, g, -1)
        xhat, _, inv_std = standardize(grouped, (2,), f32(self.epsilon))
        xhat = xhat.reshape(x.shape)
        shape = (1, c) + (1,) * (x.ndim - 2)
        s, b = (np.repeat(v, c // g) if not self.per_channel else v for v in (scale, bias))
        ctx.save(xhat=xhat, inv_std=inv_std, s=s.reshape(shape))
        return (xhat * s.reshape(shape) + b.reshape(shape)).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        xhat, n, g = ctx.xhat, dy.shape[0], int(self.num_groups)
        summed = (0, *range(2, dy.ndim))
        dx = None
        if ctx.needs(0):
            dxhat = (dy * ctx.s).reshape(n, g, -1)
            dx = standardize_backward(dxhat, xhat.reshape(n, g, -1), ctx.inv_std, (2,))
            dx = dx.reshape(dy.shape)
        dscale = (dy * xhat).sum(axis=summed)
        dbias = dy.sum(axis=summed)
        if not self.per_channel:
            dscale, dbias = (v.reshape(g, -1).sum(axis=1) for v in (dscale, dbias))
        return (dx, dscale if ctx.needs(1) else None, dbias if ctx.needs(2) else None)


@register("GroupNormalization", since=18)
class GroupNormalization18(GroupNormalization):
    """ONNX GroupNormalization-18: A GroupNormalization function."""
    attributes = {"epsilon": 1e-5, "num_groups": None}
    per_channel = False
