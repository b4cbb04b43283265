"""Flatten: reshape to 2-D at ``axis`` (ONNX opset 1+; negative axes as in opset 11)."""

from __future__ import annotations

import math

from meta.lv0 import Operator, register


@register("Flatten", since=1)
class Flatten(Operator):
    """ONNX Flatten-1: flattens the input tensor into a 2D matrix."""
    attributes = {"axis": 1}

    def forward(self, ctx, x):
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        if not 0 <= axis <= x.ndim:
            raise ValueError(f"Flatten: axis {self.axis} is out of range for rank {x.ndim}")
        ctx.save(shape=x.shape)
        return x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))

    def backward(self, ctx, dy):
        return (dy.reshape(ctx.shape),)
