"""ScatterND: data with ``updates`` written at the index tuples of ``indices`` (ONNX opset 11+;
16 added ``reduction`` add/mul, 18 max/min). Gradients as for ScatterElements."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from .gather_nd import nd_index
from .scatter_elements import REDUCE


@register("ScatterND", since=11)
class ScatterND(Operator):
    """ONNX ScatterND-11: ScatterND takes three inputs data tensor of rank r >= 1, indices
    tensor of rank q >= 1, and updates tensor of rank q + r - indices.shape[-1] - 1."""
    attributes = {"reduction": "none"}
    no_grad_inputs = (1,)

    def forward(self, ctx, data, indices, updates):
        index, shape = nd_index(data.shape, indices, 0, "ScatterND")
        if tuple(updates.shape) != shape:
            raise ValueError(f"ScatterND: updates {list(updates.shape)} must be {list(shape)}")
        y = data.copy()
        if self.reduction == "none":
            y[index] = updates
        elif self.reduction in REDUCE:
            REDUCE[self.reduction].at(y, index, updates)
        else:
            raise ValueError(f"ScatterND: unknown reduction {self.reduction!r}")
        ctx.save(index=index, data=data, updates=updates, y=y)
        return y

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None, None)
        index, data, updates, y = ctx.index, ctx.data, ctx.updates, ctx.y
        if self.reduction in ("none", "add"):
            dx = dy.copy()
            if self.reduction == "none":
                dx[index] = 0
            return (dx, None, np.asarray(dy[index]).copy())
        if self.reduction == "mul":
            factor = np.ones_like(y)
            np.multiply.at(factor, index, updates)
            with np.errstate(divide="ignore", invalid="ignore"):
                return (dy * factor, None, dy[index] * data[index] * factor[index] / updates)
        won = updates == y[index]
        return (np.where(y == data, dy, 0), None, np.where(won, dy[index], 0))
