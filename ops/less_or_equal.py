"""LessOrEqual: a <= b as bool (ONNX opset 12+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("LessOrEqual", since=12)
class LessOrEqual(Predicate):
    fn = np.less_equal
