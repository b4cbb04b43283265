"""Expand: broadcast x with ``shape`` both ways, numpy style (ONNX opset 8+); the gradient
sums back over what was broadcast."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._axes import as_ints


@register("Expand", since=8)
class Expand(Operator):
    """ONNX Expand-8: broadcast the input tensor following the given shape and the broadcast
    rule."""
    no_grad_inputs = (1,)

    def forward(self, ctx, x, shape):
        try:
            target = np.broadcast_shapes(x.shape, tuple(as_ints(shape)))
        except ValueError as err:
            raise ValueError(f"Expand: input {list(x.shape)} cannot be broadcast with shape "
                             f"{as_ints(shape)}") from err
        ctx.save(x_shape=x.shape)
        return np.broadcast_to(x, target).copy()

    def backward(self, ctx, dy):
        return (None if dy is None else unbroadcast(dy, ctx.x_shape), None)
