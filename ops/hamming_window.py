"""HammingWindow: the Hamming window 25/46 - 21/46 cos(2 pi k / N)
(ONNX opset 17+; see _cosine_window)."""

from __future__ import annotations

from meta.lv0 import register

from ._cosine_window import CosineWindow


@register("HammingWindow", since=17)
class HammingWindow(CosineWindow):
    """ONNX HammingWindow-17: generates a Hamming window as described in the paper
    https://ieeexplore.ieee.org/document/1455106."""
    coefficients = (25 / 46, 21 / 46)
