"""SwiGLU (ONNX opset 28+): ``Y = A * sigmoid(alpha * A) * B`` (A and B of one shape).
Backward w.r.t. A and B."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("SwiGLU", since=28)
class SwiGLU(Operator):
    """ONNX SwiGLU-28: SwiGLU is a gated activation that takes two inputs, a gate A and a linear
    (value) input B, and produces one output Y."""
    attributes = {"alpha": 1.0}

    def forward(self, ctx, a, b):
        if a.shape != b.shape:
            raise ValueError(f"SwiGLU: A {list(a.shape)} and B {list(b.shape)} must have one "
                             f"shape (no broadcasting)")
        s = (1 / (1 + np.exp(-self.alpha * a))).astype(a.dtype, copy=False)
        swish = a * s
        ctx.save(a=a, b=b, s=s, swish=swish)
        return (swish * b).astype(a.dtype, copy=False)

    def backward(self, ctx, dy):
        a, s = ctx.a, ctx.s
        dswish = s + a * self.alpha * s * (1 - s)
        return ((dy * ctx.b * dswish).astype(a.dtype, copy=False),
                (dy * ctx.swish).astype(a.dtype, copy=False))
