"""HannWindow: the Hann window 0.5 - 0.5 cos(2 pi k / N) (ONNX opset 17+; see _cosine_window)."""

from __future__ import annotations

from meta.lv0 import register

from ._cosine_window import CosineWindow


@register("HannWindow", since=17)
class HannWindow(CosineWindow):
    coefficients = (0.5, 0.5)
