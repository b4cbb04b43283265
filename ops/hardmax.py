"""Hardmax: 1 at the first maximum along ``axis``, 0 elsewhere (ONNX opset 13+; opsets 1-12
coerce the input to 2-D at ``axis``, default 1, as Softmax did). Piecewise constant: the
gradient is 0."""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


def hardmax(x: np.ndarray, axis: int) -> np.ndarray:
    idx = np.expand_dims(np.argmax(x, axis=axis), axis)
    y = np.zeros_like(x)
    np.put_along_axis(y, idx, 1, axis)
    return y


@register("Hardmax", since=13)
class Hardmax(Operator):
    """ONNX Hardmax-13: the operator computes the hardmax values for the given input."""
    attributes = {"axis": -1}

    def forward(self, ctx, x):
        ctx.save(shape=x.shape)
        if x.size == 0:
            return np.zeros_like(x)
        return hardmax(x, normalize_axis(self.axis, x.ndim, "Hardmax"))

    def backward(self, ctx, dy):
        return (None if dy is None else np.zeros(ctx.shape, dy.dtype),)


@register("Hardmax", since=1)
class Hardmax1(Hardmax):
    """ONNX Hardmax-1: the operator computes the hardmax (1 for the first maximum value, and 0
    for all others) values for each layer in the batch of the given input."""
    attributes = {"axis": 1}

    def forward(self, ctx, x):
        ctx.save(shape=x.shape)
        axis = normalize_axis(self.axis, max(x.ndim, 1), "Hardmax")
        flat = x.reshape(math.prod(x.shape[:axis]), -1)
        return (hardmax(flat, 1) if flat.size else flat).reshape(x.shape)
