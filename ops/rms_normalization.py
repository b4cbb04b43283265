"""RMSNormalization: x / sqrt(mean(x^2 over axes ``axis``..last) + epsilon) * scale (ONNX
opset 23+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._axes import normalize_axis
from ._elementwise import f32


@register("RMSNormalization", since=23)
class RMSNormalization(Operator):
    """ONNX RMSNormalization-23: this is RMS normalization defined in ONNX as function as
    described in the paper https://arxiv.org/pdf/1910.07467."""
    learnable_inputs = (1,)  # scale
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}

    def forward(self, ctx, x, scale):
        axis = normalize_axis(self.axis, x.ndim, "RMSNormalization")
        axes = tuple(range(axis, x.ndim))
        inv = np.reciprocal(np.sqrt(np.mean(x * x, axis=axes, keepdims=True)
                                    + np.asarray(f32(self.epsilon), x.dtype)))
        normed = x * inv
        ctx.save(axes=axes, normed=normed, inv=inv, scale=scale)
        return (normed * scale).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        n, inv, axes = ctx.normed, ctx.inv, ctx.axes
        dn = dy * ctx.scale
        dx = inv * (dn - n * np.mean(dn * n, axis=axes, keepdims=True))
        return (dx, unbroadcast(dy * n, ctx.scale.shape))
