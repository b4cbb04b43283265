"""ArgMax: see ops/_arg.py (ONNX opset 1+)."""

from __future__ import annotations

from meta.lv0 import register

from ._arg import ArgExtreme


@register("ArgMax", since=1)
class ArgMax(ArgExtreme):
    """ONNX ArgMax-1: computes the indices of the max elements of the input tensor's element
    along the provided axis."""
    largest = True
