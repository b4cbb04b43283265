"""GreaterOrEqual: a >= b as bool (ONNX opset 12+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("GreaterOrEqual", since=12)
class GreaterOrEqual(Predicate):
    """ONNX GreaterOrEqual-12: returns the tensor resulted from performing the greater_equal
    logical operation elementwise on the input tensors A and B (with Numpy-style broadcasting
    support)."""
    fn = np.greater_equal
