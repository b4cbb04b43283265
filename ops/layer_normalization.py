"""LayerNormalization: standardise over axes ``axis``..last, then scale and shift (ONNX opset
17+). Outputs Y and, optionally, Mean and InvStdDev (shaped like X with the normalised axes
kept as 1). Statistics are computed in X's dtype, as onnx.reference does; every output is
differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._axes import normalize_axis
from ._elementwise import f32
from ._normalize import standardize, standardize_backward


@register("LayerNormalization", since=17)
class LayerNormalization(Operator):
    """ONNX LayerNormalization-17: this is layer normalization defined in ONNX as function."""
    learnable_inputs = (1, 2)  # scale and bias
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def forward(self, ctx, x, scale, bias=None):
        axis = normalize_axis(self.axis, x.ndim, "LayerNormalization")
        axes = tuple(range(axis, x.ndim))
        xhat, mean, inv_std = standardize(x, axes, f32(self.epsilon))
        y = xhat * scale
        if bias is not None:
            y = y + bias
        ctx.save(axes=axes, xhat=xhat, inv_std=inv_std, scale=scale,
                 has_bias=bias is not None, bias_shape=None if bias is None else bias.shape)
        return y.astype(x.dtype, copy=False), mean, inv_std

    def backward(self, ctx, dy, dmean=None, dinv_std=None):
        xhat, scale = ctx.xhat, ctx.scale
        if dy is None:
            dy = np.zeros_like(xhat)
        dx = standardize_backward(dy * scale, xhat, ctx.inv_std, ctx.axes, dmean, dinv_std) \
            if ctx.needs(0) else None
        dscale = unbroadcast(dy * xhat, scale.shape) if ctx.needs(1) else None
        dbias = unbroadcast(dy, ctx.bias_shape) if ctx.has_bias and ctx.needs(2) else None
        return (dx, dscale, dbias)
