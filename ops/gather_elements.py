"""GatherElements: y[i][j] = x[index[i][j]][j] along ``axis`` (ONNX opset 11+; 13 only added
types); the gradient scatter-adds dy back (repeated indices add up)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis
from ._index import along_axis, wrap


@register("GatherElements", since=11)
class GatherElements(Operator):
    """ONNX GatherElements-11: GatherElements takes two inputs data and indices of the same rank
    r >= 1 and an optional attribute axis that identifies an axis of data (by default, the
    outer-most axis, that is axis 0)."""
    attributes = {"axis": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, indices):
        axis = normalize_axis(self.axis, x.ndim, "GatherElements")
        idx = wrap(indices, x.shape[axis], "GatherElements")
        ctx.save(x_shape=x.shape, idx=idx, axis=axis)
        return np.take_along_axis(x, idx, axis)

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        dx = np.zeros(ctx.x_shape, dy.dtype)
        np.add.at(dx, along_axis(ctx.x_shape, ctx.idx, ctx.axis), dy)
        return (dx, None)
