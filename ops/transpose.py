"""Transpose: permute axes by ``perm``, by default reversing them (ONNX opset 1+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Transpose", since=1)
class Transpose(Operator):
    """ONNX Transpose-1: returns a transpose of the input tensor."""
    attributes = {"perm": None}

    def forward(self, ctx, x):
        perm = list(range(x.ndim))[::-1] if self.perm is None else [int(p) for p in self.perm]
        if sorted(perm) != list(range(x.ndim)):
            raise ValueError(f"Transpose: perm {perm} is not a permutation of the axes of an "
                             f"input of shape {x.shape}")
        ctx.save(perm=perm)
        return np.transpose(x, perm)

    def backward(self, ctx, dy):
        return (None if dy is None else np.transpose(dy, np.argsort(ctx.perm)),)
