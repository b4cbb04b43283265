"""Range: start, start + delta, ... up to but excluding limit (ONNX opset 11+); the scalars'
type is the output's. Not differentiable (a shape computation)."""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register


@register("Range", since=11)
class Range(Operator):
    """ONNX Range-11: generate a tensor containing a sequence of numbers that begin at start and
    extends by increments of delta up to limit (exclusive)."""
    no_grad_inputs = (0, 1, 2)

    def forward(self, ctx, start, limit, delta):
        start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
        if delta == 0:
            raise ValueError("Range: delta must not be 0")
        dtype = start.dtype
        n = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
        # start + i * delta in the inputs' type, as the spec's loop accumulates it
        return (start + np.arange(n, dtype=dtype) * delta).astype(dtype, copy=False)

    def backward(self, ctx, dy):
        return (None, None, None)
