"""Clip: min(max(x, lo), hi); bounds are attributes (opset 6) or optional scalar inputs (11+).

When lo > hi every element becomes hi, as the spec says and numpy.clip does. The gradient
flows to x inside [lo, hi], to lo where x is below it, and to hi where the result is hi.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

FLT_MAX = float(np.finfo(np.float32).max)


@register("Clip", since=11)
class Clip(Operator):
    """ONNX Clip-11: Clip operator limits the given input within an interval."""
    constant_inputs = (1, 2)  # ReLU6's bounds: an initializer here is a constant, not learned

    def forward(self, ctx, x, lo=None, hi=None):
        for name, bound in (("min", lo), ("max", hi)):
            if bound is not None and np.size(bound) != 1:
                raise ValueError(f"Clip: {name} must be a scalar, got shape {np.shape(bound)}")
        lifted = x if lo is None else np.maximum(x, lo)
        y = lifted if hi is None else np.minimum(lifted, hi)
        ctx.save(x=x, lo=lo, hi=hi, lifted=lifted)
        return y.astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        x, lo, hi = ctx.x, ctx.lo, ctx.hi
        below = np.zeros(x.shape, bool) if lo is None else x < lo
        capped = np.zeros(x.shape, bool) if hi is None else ctx.lifted > hi
        dx = np.where(below | capped, 0, dy).astype(dy.dtype, copy=False) if ctx.needs(0) else None
        dlo = dhi = None
        if lo is not None and ctx.needs(1) and np.issubdtype(lo.dtype, np.floating):
            dlo = np.asarray(dy[below & ~capped].sum(), dtype=lo.dtype).reshape(lo.shape)
        if hi is not None and ctx.needs(2) and np.issubdtype(hi.dtype, np.floating):
            dhi = np.asarray(dy[capped].sum(), dtype=hi.dtype).reshape(hi.shape)
        return (dx, dlo, dhi)


@register("Clip", since=6)
class Clip6(Clip):
    """ONNX Clip-6: Clip operator limits the given input within an interval."""
    attributes = {"min": -FLT_MAX, "max": FLT_MAX}

    def forward(self, ctx, x):
        lo, hi = np.asarray(self.min, x.dtype), np.asarray(self.max, x.dtype)
        return super().forward(ctx, x, lo, hi)

    def backward(self, ctx, dy):
        return super().backward(ctx, dy)[:1]
