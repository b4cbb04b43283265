"""Shape: the input's shape as an int64 vector (ONNX opset 1+; a start/end window from 15).

Start and end are clamped to [0, rank] after adding the rank to negative values. The output
does not depend on the input's values, so the input gets no gradient.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Shape", since=15)
class Shape(Operator):
    """ONNX Shape-15: takes a tensor as input and outputs an 1D int64 tensor containing the
    shape of the input tensor."""
    attributes = {"start": 0, "end": None}
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        rank = x.ndim
        start, end = self.start, rank if self.end is None else self.end
        start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
        return np.array(x.shape[start:end], dtype=np.int64)

    def backward(self, ctx, dy):
        return (None,)


@register("Shape", since=1)
class Shape1(Shape):
    """ONNX Shape-1: takes a tensor as input and outputs an 1D int64 tensor containing the shape
    of the input tensor."""
    attributes = {}
    start, end = 0, None
