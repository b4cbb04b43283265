"""BitShift: a << b or a >> b of unsigned integer tensors, with broadcasting (ONNX opset 11+)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("BitShift", since=11)
class BitShift(Predicate):
    """ONNX BitShift-11: bitwise shift operator performs element-wise operation."""
    attributes = {"direction": None}

    def forward(self, ctx, a, b):
        if self.direction not in ("LEFT", "RIGHT"):
            raise ValueError(f"BitShift: direction must be 'LEFT' or 'RIGHT', got "
                             f"{self.direction!r}")
        shift = np.left_shift if self.direction == "LEFT" else np.right_shift
        return shift(a, b).astype(a.dtype, copy=False)
