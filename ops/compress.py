"""Compress: the slices along ``axis`` (or the flattened elements, without axis) where a 1-D
bool condition is true (ONNX opset 9+; 11 negative axes). The gradient scatters dy back."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("Compress", since=9)
class Compress(Operator):
    """ONNX Compress-9: selects slices from an input tensor along a given axis where condition
    evaluates to True for each axis index."""
    attributes = {"axis": None}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, condition):
        cond = np.asarray(condition, bool).reshape(-1)
        axis = None if self.axis is None else normalize_axis(self.axis, x.ndim, "Compress")
        size = x.size if axis is None else x.shape[axis]
        keep = np.nonzero(cond[:size])[0]
        ctx.save(shape=x.shape, axis=axis, keep=keep)
        return np.take(x, keep, axis=axis)

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        if ctx.axis is None:
            dx = np.zeros(int(np.prod(ctx.shape)), dy.dtype)
            dx[ctx.keep] = dy
            return (dx.reshape(ctx.shape), None)
        dx = np.zeros(ctx.shape, dy.dtype)
        index = [slice(None)] * len(ctx.shape)
        index[ctx.axis] = ctx.keep
        dx[tuple(index)] = dy
        return (dx, None)
