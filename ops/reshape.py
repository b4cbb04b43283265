"""Reshape: data to the shape given as an int64 input (ONNX opset 5+, allowzero from 14)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Reshape", since=5)
class Reshape(Operator):
    """ONNX Reshape-5: Reshape the input tensor similar to numpy.reshape."""
    attributes = {"allowzero": 0}

    def forward(self, ctx, data, shape):
        target = [int(d) for d in np.asarray(shape).reshape(-1)]
        if not self.allowzero:  # 0 copies the input's dimension at that position
            target = [data.shape[i] if d == 0 and i < data.ndim else d
                      for i, d in enumerate(target)]
        try:
            y = data.reshape(target)
        except ValueError as err:
            raise ValueError(f"Reshape: cannot reshape {data.shape} to {target}") from err
        ctx.save(shape=data.shape)
        return y

    def backward(self, ctx, dy):
        return (dy.reshape(ctx.shape), None)
