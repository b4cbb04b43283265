"""Tile: x repeated ``repeats[i]`` times along each axis (ONNX opset 6+); the gradient sums the
copies."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import as_ints


@register("Tile", since=6)
class Tile(Operator):
    """ONNX Tile-6: constructs a tensor by tiling a given tensor."""
    no_grad_inputs = (1,)

    def forward(self, ctx, x, repeats):
        reps = as_ints(repeats)
        if len(reps) != x.ndim or any(r < 0 for r in reps):
            raise ValueError(f"Tile: repeats {reps} must be {x.ndim} non-negative counts for "
                             f"input {list(x.shape)}")
        ctx.save(x_shape=x.shape, reps=reps)
        return np.tile(x, reps) if x.ndim else x.copy()

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        # (r0 * s0, r1 * s1, ...) -> (r0, s0, r1, s1, ...), summed over the r axes
        split = [n for pair in zip(ctx.reps, ctx.x_shape) for n in pair]
        dx = dy.reshape(split).sum(axis=tuple(range(0, 2 * len(ctx.reps), 2))) if ctx.reps \
            else dy
        return (dx.reshape(ctx.x_shape), None)
