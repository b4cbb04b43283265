"""Gather: pick entries of ``data`` along ``axis`` by int indices (negative ones count from the
end), ONNX opset 1+. The output shape is data.shape[:axis] + indices.shape + data.shape[axis+1:].

Indices may repeat, so the gradient is a scatter-add (np.add.at), not an assignment.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("Gather", since=1)
class Gather(Operator):
    """ONNX Gather-1: given data tensor of rank r >= 1, and indices tensor of rank q, gather
    entries of the axis dimension of data (by default outer-most one as axis=0) indexed by
    indices, and concatenates them in an ..."""
    learnable_inputs = (0,)  # an embedding table
    attributes = {"axis": 0}

    def forward(self, ctx, data, indices):
        axis = normalize_axis(self.axis, data.ndim, self.op_type)
        n = data.shape[axis]
        if indices.size and (indices.min() < -n or indices.max() >= n):
            raise IndexError(f"Gather: indices must lie in [{-n}, {n - 1}] for axis {axis} of "
                             f"data of shape {data.shape}; got [{indices.min()}, {indices.max()}]")
        indices = np.where(indices < 0, indices + n, indices)
        ctx.save(axis=axis, indices=indices, shape=data.shape)
        return np.take(data, indices, axis=axis)

    def backward(self, ctx, dy):
        if dy is None or not ctx.needs(0):
            return (None, None)
        dx = np.zeros(ctx.shape, dy.dtype)
        np.add.at(dx, (slice(None),) * ctx.axis + (ctx.indices,), dy)
        return (dx, None)
