"""TopK: the k largest (or smallest) values along ``axis`` and their int64 indices, sorted,
ties broken by the lower index (ONNX opset 1: k attribute; 10: k input; 11: ``largest``,
``sorted``). The gradient puts dy back at the indices."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("TopK", since=11)
class TopK(Operator):
    """ONNX TopK-11: retrieve the top-K largest or smallest elements along a specified axis."""
    attributes = {"axis": -1, "largest": 1, "sorted": 1}
    no_grad_inputs = (1,)

    def _k(self, k):
        return int(np.asarray(k).reshape(-1)[0])

    def forward(self, ctx, x, k=None):
        axis = normalize_axis(self.axis, x.ndim, "TopK")
        k = self._k(k)
        if not 0 <= k <= x.shape[axis]:
            raise ValueError(f"TopK: k={k} is out of range for axis {axis} of {list(x.shape)}")
        keys = x.astype(np.int64) if x.dtype.kind in "ub" else x
        order = np.argsort(-keys if self.largest else keys, axis=axis, kind="stable")
        idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
        ctx.save(idx=idx, axis=axis, shape=x.shape)
        return np.take_along_axis(x, idx, axis), idx

    def backward(self, ctx, dy, di=None):
        if dy is None:
            return (None, None)
        dx = np.zeros(ctx.shape, dy.dtype)
        np.put_along_axis(dx, ctx.idx, dy, ctx.axis)
        return (dx, None)


@register("TopK", since=10)
class TopK10(TopK):
    """ONNX TopK-10: retrieve the top-K elements along a specified axis."""
    attributes = {"axis": -1}
    largest, sorted = 1, 1


@register("TopK", since=1)
class TopK1(TopK):
    """ONNX TopK-1: retrieve the top-K elements along a specified axis."""
    attributes = {"axis": -1, "k": None}
    largest, sorted = 1, 1

    def forward(self, ctx, x):
        return super().forward(ctx, x, self.k)

    def backward(self, ctx, dy, di=None):
        return super().backward(ctx, dy)[:1]
