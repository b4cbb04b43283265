"""ReduceMax: the maximum (-inf over an empty set)
over axes (ONNX opsets 1-17 take axes as an attribute, 18+ as an optional int64 input with
``noop_with_empty_axes``)."""

from __future__ import annotations

from meta.lv0 import register

from ._reductions import Extreme


@register("ReduceMax", since=18)
class ReduceMax(Extreme):
    """ONNX ReduceMax-18: computes the max of the input tensor's elements along the provided
    axes."""
    largest = True


@register("ReduceMax", since=1)
class ReduceMax1(ReduceMax):
    """ONNX ReduceMax-1: computes the max of the input tensor's element along the provided axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
