"""Size: the number of elements, an int64 scalar (ONNX opset 1+); no gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Size", since=1)
class Size(Operator):
    """ONNX Size-1: takes a tensor as input and outputs a int64 scalar that equals to the total
    number of elements of the input tensor."""
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        return np.array(x.size, dtype=np.int64)

    def backward(self, ctx, dy):
        return (None,)
