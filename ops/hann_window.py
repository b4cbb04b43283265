"""HannWindow: the Hann window 0.5 - 0.5 cos(2 pi k / N) (ONNX opset 17+; see _cosine_window)."""

from __future__ import annotations

from meta.lv0 import register

from ._cosine_window import CosineWindow


@register("HannWindow", since=17)
class HannWindow(CosineWindow):
    """ONNX HannWindow-17: generates a Hann window as described in the paper
    https://ieeexplore.ieee.org/document/1455106."""
    coefficients = (0.5, 0.5)
