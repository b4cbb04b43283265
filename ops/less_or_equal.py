"""LessOrEqual: a <= b as bool (ONNX opset 12+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("LessOrEqual", since=12)
class LessOrEqual(Predicate):
    """ONNX LessOrEqual-12: returns the tensor resulted from performing the less_equal logical
    operation elementwise on the input tensors A and B (with Numpy-style broadcasting support)."""
    fn = np.less_equal
