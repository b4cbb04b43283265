"""BitCast (ONNX opset 26+): reinterpret X's bytes as type ``to`` of the same width.
Not differentiable."""

from __future__ import annotations

import numpy as np
from onnx import helper

from meta.lv0 import Operator, register


@register("BitCast", since=26)
class BitCast(Operator):
    """ONNX BitCast-26: reinterprets the binary representation of a tensor as a different data
    type, specified by the 'to' attribute."""
    attributes = {"to": None}
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        if self.to is None:
            raise ValueError("BitCast: the to attribute is required")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(self.to))
        if dtype.kind in "OSU" or x.dtype.kind in "OSU":
            raise ValueError("BitCast: strings have no fixed width")
        if dtype.itemsize != x.dtype.itemsize:
            raise ValueError(f"BitCast: {x.dtype} ({x.dtype.itemsize * 8} bits) and {dtype} "
                             f"({dtype.itemsize * 8} bits) differ in width")
        return np.ascontiguousarray(x).view(dtype).reshape(x.shape)  # keeps 0-d 0-d

    def backward(self, ctx, dy):
        return (None,)
