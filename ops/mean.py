"""Mean: the elementwise mean of any number of inputs, with broadcasting (ONNX opset 6+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Mean", since=6)
class Mean(Operator):
    """ONNX Mean-6: element-wise mean of each of the input tensors."""
    def forward(self, ctx, *xs):
        broadcast_shape("Mean", *xs)
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        ctx.save(shapes=[x.shape for x in xs])
        return np.asarray(total / len(xs), dtype=np.result_type(*xs))

    def backward(self, ctx, dy):
        n = len(ctx.shapes)
        return tuple(unbroadcast(dy / n, s) if ctx.needs(i) else None
                     for i, s in enumerate(ctx.shapes))
