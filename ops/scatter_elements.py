"""ScatterElements: data with ``updates`` written at ``indices`` along ``axis`` (ONNX opset 11+;
16 added ``reduction`` none/add/mul, 18 max/min). Scatter (opset 9, deprecated in 11) is the
same with no reduction.

Gradients: data gets dy where nothing was written (none) or through the reduction; updates
get dy read back at their positions, scaled by the reduction's partial derivative.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis
from ._index import along_axis, wrap

REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@register("ScatterElements", since=11)
class ScatterElements(Operator):
    """ONNX ScatterElements-11: ScatterElements takes three inputs data, updates, and indices of
    the same rank r >= 1 and an optional attribute axis that identifies an axis of data (by
    default, the outer-most axis, that is axis 0)."""
    attributes = {"axis": 0, "reduction": "none"}
    no_grad_inputs = (1,)

    def forward(self, ctx, data, indices, updates):
        axis = normalize_axis(self.axis, data.ndim, self.op_type)
        idx = along_axis(data.shape, wrap(indices, data.shape[axis], self.op_type), axis)
        if indices.shape != updates.shape:
            raise ValueError(f"{self.op_type}: indices {list(indices.shape)} and updates "
                             f"{list(updates.shape)} must have one shape")
        y = data.copy()
        if self.reduction == "none":
            y[idx] = updates
        elif self.reduction in REDUCE:
            REDUCE[self.reduction].at(y, idx, updates)
        else:
            raise ValueError(f"{self.op_type}: unknown reduction {self.reduction!r}")
        ctx.save(idx=idx, data=data, updates=updates, y=y)
        return y

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None, None)
        idx, data, updates, y = ctx.idx, ctx.data, ctx.updates, ctx.y
        if self.reduction in ("none", "add"):
            dx = dy.copy()
            if self.reduction == "none":
                dx[idx] = 0
            return (dx, None, dy[idx].copy())
        if self.reduction == "mul":
            # y = data * prod(updates at the position): each factor's partial is y / factor
            factor = np.ones_like(y)
            np.multiply.at(factor, idx, updates)
            with np.errstate(divide="ignore", invalid="ignore"):
                return (dy * factor, None, dy[idx] * data[idx] * factor[idx] / updates)
        won = updates == y[idx]  # max/min: whoever equals the result took it
        return (np.where(y == data, dy, 0), None, np.where(won, dy[idx], 0))


@register("Scatter", since=9)
class Scatter(ScatterElements):
    """ONNX Scatter-9: given data, updates and indices input tensors of rank r >= 1, write the
    values provided by updates into the first input, data, along axis dimension of data (by
    default outer-most one as axis=0) at ..."""
    attributes = {"axis": 0}
    reduction = "none"
