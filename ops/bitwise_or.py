"""BitwiseOr: bitwise or of integer tensors (ONNX opset 18+), with broadcasting; not
differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("BitwiseOr", since=18)
class BitwiseOr(Predicate):
    """ONNX BitwiseOr-18: returns the tensor resulting from performing the bitwise or operation
    elementwise on the input tensors A and B (with Numpy-style broadcasting support)."""
    fn = np.bitwise_or
