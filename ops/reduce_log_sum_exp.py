"""ReduceLogSumExp: log of the sum of exponentials (computed stably)
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._reductions import Reduction


@register("ReduceLogSumExp", since=18)
class ReduceLogSumExp(Reduction):
    """ONNX ReduceLogSumExp-18: computes the log sum exponent of the input tensor's elements
    along the provided axes."""
    def compute(self, x, axes):
        if x.dtype.kind != "f":
            return np.log(np.sum(np.exp(x), axis=axes, keepdims=True))
        m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0)
        return m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))

    def gradient(self, x, y, dy):
        return dy * np.exp(x - y)


@register("ReduceLogSumExp", since=1)
class ReduceLogSumExp1(ReduceLogSumExp):
    """ONNX ReduceLogSumExp-1: computes the log sum exponent of the input tensor's element along
    the provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
