"""ReduceSum: sum over axes (attribute before opset 13, int64 input with noop option from 13)."""

from __future__ import annotations

from meta.lv0 import register

from ._reduce import Reduce


@register("ReduceSum", since=13)
class ReduceSum(Reduce):
    """ONNX ReduceSum-13: computes the sum of the input tensor's elements along the provided
    axes."""
    pass


@register("ReduceSum", since=1)
class ReduceSum1(Reduce):
    """ONNX ReduceSum-1: computes the sum of the input tensor's element along the provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
