"""And: logical and of bool tensors (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("And", since=7)
class And(Predicate):
    fn = np.logical_and
