"""Xor: logical xor of bool tensors (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("Xor", since=7)
class Xor(Predicate):
    fn = np.logical_xor
