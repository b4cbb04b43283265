"""ReduceMin: the minimum (+inf over an empty set)
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

from meta.lv0 import register

from ._reductions import Extreme


@register("ReduceMin", since=18)
class ReduceMin(Extreme):
    """ONNX ReduceMin-18: computes the min of the input tensor's elements along the provided
    axes."""
    largest = False


@register("ReduceMin", since=1)
class ReduceMin1(ReduceMin):
    """ONNX ReduceMin-1: computes the min of the input tensor's element along the provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
