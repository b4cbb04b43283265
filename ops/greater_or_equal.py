"""GreaterOrEqual: a >= b as bool (ONNX opset 12+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("GreaterOrEqual", since=12)
class GreaterOrEqual(Predicate):
    fn = np.greater_equal
