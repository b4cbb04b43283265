"""ReduceSumSquare: the sum of squares
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceSumSquare", since=18)
class ReduceSumSquare(Reduction):
    """ONNX ReduceSumSquare-18: computes the sum square of the input tensor's elements along the
    provided axes."""
    def compute(self, x, axes):
        return np.sum(np.square(x), axis=axes, keepdims=True)

    def gradient(self, x, y, dy):
        return 2 * dy * x


@register("ReduceSumSquare", since=1)
class ReduceSumSquare1(ReduceSumSquare):
    """ONNX ReduceSumSquare-1: computes the sum square of the input tensor's element along the
    provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
