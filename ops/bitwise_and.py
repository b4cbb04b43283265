"""BitwiseAnd: bitwise and of integer tensors (ONNX opset 18+), with broadcasting; not
differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("BitwiseAnd", since=18)
class BitwiseAnd(Predicate):
    fn = np.bitwise_and
