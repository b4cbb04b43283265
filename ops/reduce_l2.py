"""ReduceL2: the Euclidean norm
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceL2", since=18)
class ReduceL2(Reduction):
    """ONNX ReduceL2-18: computes the L2 norm of the input tensor's elements along the provided
    axes."""
    def compute(self, x, axes):
        return np.sqrt(np.sum(np.square(x), axis=axes, keepdims=True))

    def gradient(self, x, y, dy):
        return np.where(y == 0, 0, dy * x / np.where(y == 0, 1, y))


@register("ReduceL2", since=1)
class ReduceL21(ReduceL2):
    """ONNX ReduceL2-1: computes the L2 norm of the input tensor's element along the provided
    axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
