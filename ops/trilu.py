"""Trilu: the upper (``upper=1``) or lower triangle of the last two axes, from diagonal k
(ONNX opset 14+); the gradient is masked the same way."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Trilu", since=14)
class Trilu(Operator):
    """ONNX Trilu-14: given a 2-D matrix or batches of 2-D matrices, returns the upper or lower
    triangular part of the tensor(s)."""
    attributes = {"upper": 1}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, k=None):
        if x.ndim < 2:
            raise ValueError(f"Trilu: input {list(x.shape)} must have rank >= 2")
        diagonal = 0 if k is None else int(np.asarray(k).reshape(()))
        ctx.save(diagonal=diagonal)
        return self._mask(x, diagonal)

    def _mask(self, x, k):
        return np.triu(x, k) if self.upper else np.tril(x, k)

    def backward(self, ctx, dy):
        return (None if dy is None else self._mask(dy, ctx.diagonal), None)
