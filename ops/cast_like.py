"""CastLike: x converted to the element type of ``target`` (ONNX opset 15+; 19 added
``saturate``, which only float8 types use: out-of-range values become the largest one). Float
to float passes the gradient back."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("CastLike", since=15)
class CastLike(Operator):
    """ONNX CastLike-15: the operator casts the elements of a given input tensor (the first
    input) to the same data type as the elements of the second input tensor."""
    attributes = {"saturate": 1}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, target):
        ctx.save(dtype=x.dtype, float=x.dtype.kind == "f" and target.dtype.kind == "f")
        if self.saturate and "float8" in target.dtype.name and x.dtype.kind == "f":
            import ml_dtypes  # onnx's own dependency: it brings numpy its float8 types

            top = float(ml_dtypes.finfo(target.dtype).max)
            x = np.clip(x, -top, top)  # saturate: out of range (and inf) -> the largest value
        return x.astype(target.dtype)

    def backward(self, ctx, dy):
        if dy is None or not ctx.float:
            return (None, None)
        return (dy.astype(ctx.dtype, copy=False), None)

