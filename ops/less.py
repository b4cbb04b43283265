"""Less: a < b as bool (ONNX opset 7+), with broadcasting; not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._logic import Predicate


@register("Less", since=7)
class Less(Predicate):
    fn = np.less
