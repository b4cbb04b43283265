"""BlackmanWindow: the Blackman window 0.42 - 0.5 cos(2 pi k / N) + 0.08 cos(4 pi k / N)
(ONNX opset 17+; see _cosine_window)."""

from __future__ import annotations

from meta.lv0 import register

from ._cosine_window import CosineWindow


@register("BlackmanWindow", since=17)
class BlackmanWindow(CosineWindow):
    """ONNX BlackmanWindow-17: generates a Blackman window as described in the paper
    https://ieeexplore.ieee.org/document/1455106."""
    coefficients = (0.42, 0.5, 0.08)
