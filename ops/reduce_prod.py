"""ReduceProd: the product
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceProd", since=18)
class ReduceProd(Reduction):
    """ONNX ReduceProd-18: computes the product of the input tensor's elements along the
    provided axes."""
    def compute(self, x, axes):
        return np.prod(x, axis=axes, keepdims=True)

    def gradient(self, x, y, dy):
        # the product of the others, also where x is 0 (y / x would be 0 / 0 there)
        axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b)
        zero = x == 0
        zeros = zero.sum(axis=axes, keepdims=True)
        rest = np.prod(np.where(zero, 1, x), axis=axes, keepdims=True)
        others = np.where(zero, np.where(zeros == 1, rest, 0),
                          np.where(zeros == 0, rest / np.where(zero, 1, x), 0))
        return dy * others


@register("ReduceProd", since=1)
class ReduceProd1(ReduceProd):
    """ONNX ReduceProd-1: computes the product of the input tensor's element along the provided
    axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
