"""Unique (ONNX opset 11+): the distinct values (or slices along ``axis``) of X.

Outputs Y (sorted ascending, or with ``sorted=0`` in order of first occurrence), indices (the
first occurrence of each in X), inverse_indices (for each element / slice of X, its place in
Y) and counts, all int64. Without ``axis`` X is flattened. Not differentiable (as
``torch.unique``): X gets no gradient.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("Unique", since=11)
class Unique(Operator):
    """ONNX Unique-11: find the unique elements of a tensor."""
    attributes = {"axis": None, "sorted": 1}
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        axis = None if self.axis is None else normalize_axis(self.axis, x.ndim, "Unique")
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                              return_counts=True, axis=axis)
        inverse = inverse.reshape(-1)
        if not self.sorted:
            order = np.argsort(first, kind="stable")
            rank = np.empty_like(order)
            rank[order] = np.arange(len(order))
            first, counts, inverse = first[order], counts[order], rank[inverse]
            y = np.take(x.reshape(-1) if axis is None else x, first, axis=axis or 0)
        as64 = [np.asarray(v, np.int64) for v in (first, inverse, counts)]
        return (y, *as64)

    def backward(self, ctx, *grads):
        return (None,)
