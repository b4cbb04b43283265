"""ArgMin: see ops/_arg.py (ONNX opset 1+)."""

from __future__ import annotations

from meta.lv0 import register

from ._arg import ArgExtreme


@register("ArgMin", since=1)
class ArgMin(ArgExtreme):
    largest = False
