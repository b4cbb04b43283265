"""BitwiseXor: bitwise xor of integer tensors (ONNX opset 18+), with broadcasting; not
differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("BitwiseXor", since=18)
class BitwiseXor(Predicate):
    fn = np.bitwise_xor
