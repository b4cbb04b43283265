"""ArgMin: see ops/_arg.py (ONNX opset 1+)."""

from __future__ import annotations

from meta.lv0 import register

from ._arg import ArgExtreme


@register("ArgMin", since=1)
class ArgMin(ArgExtreme):
    """ONNX ArgMin-1: computes the indices of the min elements of the input tensor's element
    along the provided axis."""
    largest = False
