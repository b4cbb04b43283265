"""ReduceLogSum: log of the sum
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceLogSum", since=18)
class ReduceLogSum(Reduction):
    """ONNX ReduceLogSum-18: computes the log sum of the input tensor's elements along the
    provided axes."""
    def compute(self, x, axes):
        return np.log(np.sum(x, axis=axes, keepdims=True))

    def gradient(self, x, y, dy):
        return dy / np.exp(y)


@register("ReduceLogSum", since=1)
class ReduceLogSum1(ReduceLogSum):
    """ONNX ReduceLogSum-1: computes the log sum of the input tensor's element along the
    provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
