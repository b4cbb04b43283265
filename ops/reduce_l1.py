"""ReduceL1: the sum of absolute values
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceL1", since=18)
class ReduceL1(Reduction):
    """ONNX ReduceL1-18: computes the L1 norm of the input tensor's elements along the provided
    axes."""
    def compute(self, x, axes):
        return np.sum(np.abs(x), axis=axes, keepdims=True)

    def gradient(self, x, y, dy):
        return dy * np.sign(x)


@register("ReduceL1", since=1)
class ReduceL11(ReduceL1):
    """ONNX ReduceL1-1: computes the L1 norm of the input tensor's element along the provided
    axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
