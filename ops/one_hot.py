"""OneHot: ``values[1]`` where indices hit, ``values[0]`` elsewhere, a new axis of size
``depth`` at ``axis`` (ONNX opset 9+; 11 allowed negative indices, counted from depth).
Indices out of range give all-off rows. The gradient goes to ``values`` only."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("OneHot", since=9)
class OneHot(Operator):
    """ONNX OneHot-9: produces a one-hot tensor based on inputs."""
    attributes = {"axis": -1}
    no_grad_inputs = (0, 1)
    constant_inputs = (2,)  # the off/on values are settings, not learned weights

    def forward(self, ctx, indices, depth, values):
        depth = int(np.asarray(depth).reshape(-1)[0])
        rank = indices.ndim + 1
        axis = normalize_axis(self.axis, rank, "OneHot")
        idx = np.asarray(indices).astype(np.int64)
        idx = np.where(idx < 0, idx + depth, idx)
        shape = [1] * rank
        shape[axis] = depth
        hot = np.expand_dims(idx, axis) == np.arange(depth).reshape(shape)
        ctx.save(hot=hot)
        off, on = values.reshape(-1)[:2]
        return np.where(hot, on, off).astype(values.dtype)

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None, None)
        hot = ctx.hot
        dv = np.array([dy[~hot].sum(), dy[hot].sum()], dtype=dy.dtype)
        return (None, None, dv)
