"""CumProd: running products along ``axis`` (a scalar input), optionally ``exclusive`` and/or
``reverse`` (ONNX opset 26+). The gradient of y_i = prod x_j over the window is
sum over later i of dy_i y_i / x_k: exact where x has no zeros (documented limitation)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis
from .cum_sum import cumsum


def cumprod(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    if reverse:
        x = np.flip(x, axis)
    y = np.cumprod(x, axis=axis, dtype=x.dtype)
    if exclusive and y.shape[axis]:
        ones = np.ones_like(np.take(y, [0], axis))
        y = np.concatenate([ones, np.take(y, np.arange(y.shape[axis] - 1), axis)], axis)
    return np.flip(y, axis) if reverse else y


@register("CumProd", since=26)
class CumProd(Operator):
    """ONNX CumProd-26: performs cumulative product of the input elements along the given axis."""
    attributes = {"exclusive": 0, "reverse": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, axis):
        a = normalize_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, "CumProd")
        y = np.ascontiguousarray(cumprod(x, a, bool(self.exclusive), bool(self.reverse)))
        ctx.save(axis=a, x=x, y=y)
        return y

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        # dx_k = sum_{i whose window holds k} dy_i y_i / x_k: the opposite-direction running
        # sum of dy * y, exclusive exactly when the forward was
        back = cumsum(dy * ctx.y, ctx.axis, bool(self.exclusive), not self.reverse)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.ascontiguousarray(back / ctx.x), None)
