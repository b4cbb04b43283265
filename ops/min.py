"""Min: the elementwise minimum of any number of inputs, with broadcasting (ONNX opset 6+;
from 8 with broadcasting, which is a superset of 6). NaN propagates."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._variadic import Choose


@register("Min", since=6)
class Min(Choose):
    """ONNX Min-6: element-wise min of each of the input tensors."""
    pick = np.minimum
