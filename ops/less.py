"""Less: a < b as bool (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("Less", since=7)
class Less(Predicate):
    """ONNX Less-7: returns the tensor resulted from performing the less logical operation
    elementwise on the input tensors A and B (with Numpy-style broadcasting support)."""
    fn = np.less
