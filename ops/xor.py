"""Xor: logical xor of bool tensors (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("Xor", since=7)
class Xor(Predicate):
    """ONNX Xor-7: returns the tensor resulted from performing the xor logical operation
    elementwise on the input tensors A and B (with Numpy-style broadcasting support)."""
    fn = np.logical_xor
