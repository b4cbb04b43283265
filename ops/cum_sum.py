"""CumSum: running sums along ``axis`` (a scalar input), optionally ``exclusive`` (each
element left out of its own sum) and/or ``reverse`` (ONNX opset 11+; 14 only added types).
The gradient is the cumulative sum of dy in the opposite direction."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


def cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis)), np.take(
            y, np.arange(y.shape[axis] - 1), axis)], axis) if y.shape[axis] else y
    return np.flip(y, axis) if reverse else y


@register("CumSum", since=11)
class CumSum(Operator):
    """ONNX CumSum-11: performs cumulative sum of the input elements along the given axis."""
    attributes = {"exclusive": 0, "reverse": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, axis):
        a = normalize_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, "CumSum")
        ctx.save(axis=a)
        return np.ascontiguousarray(cumsum(x, a, bool(self.exclusive), bool(self.reverse)))

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        dx = cumsum(dy, ctx.axis, bool(self.exclusive), not self.reverse)
        return (np.ascontiguousarray(dx), None)
