"""EyeLike: ones on diagonal k of a 2-D tensor shaped like the input, in ``dtype`` (a
TensorProto enum; default the input's type) (ONNX opset 9+); no gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from .cast import DTYPES


@register("EyeLike", since=9)
class EyeLike(Operator):
    """ONNX EyeLike-9: generate a 2D tensor (matrix) with ones on the diagonal and zeros
    everywhere else."""
    attributes = {"dtype": None, "k": 0}
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        if x.ndim != 2:
            raise ValueError(f"EyeLike: input {list(x.shape)} must be 2-D")
        dtype = x.dtype if self.dtype is None else DTYPES[self.dtype]
        return np.eye(*x.shape, k=self.k, dtype=dtype)

    def backward(self, ctx, dy):
        return (None,)
