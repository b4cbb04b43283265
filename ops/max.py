"""Max: the elementwise maximum of any number of inputs, with broadcasting (ONNX opset 6+;
from 8 with broadcasting, which is a superset of 6). NaN propagates."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._variadic import Choose


@register("Max", since=6)
class Max(Choose):
    """ONNX Max-6: element-wise max of each of the input tensors."""
    pick = np.maximum
