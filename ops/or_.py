"""Or: logical or of bool tensors (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("Or", since=7)
class Or(Predicate):
    """ONNX Or-7: returns the tensor resulted from performing the or logical operation
    elementwise on the input tensors A and B (with Numpy-style broadcasting support)."""
    fn = np.logical_or
