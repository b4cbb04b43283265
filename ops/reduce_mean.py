"""ReduceMean: mean over axes (attribute before opset 18, int64 input with noop option from 18)."""

from __future__ import annotations

from meta.lv0 import register

from ._reduce import Reduce


@register("ReduceMean", since=18)
class ReduceMean(Reduce):
    """ONNX ReduceMean-18: computes the mean of the input tensor's elements along the provided
    axes."""
    mean = True


@register("ReduceMean", since=1)
class ReduceMean1(ReduceMean):
    """ONNX ReduceMean-1: computes the mean of the input tensor's element along the provided
    axes."""
    attributes = {"axes": None, "keepdims": 1}
    axes_from = "attribute"
