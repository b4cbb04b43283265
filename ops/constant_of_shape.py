"""ConstantOfShape: a tensor of the given int64 shape filled with ``value`` (ONNX opset 9+).

``value`` is a one-element tensor whose type is the output's; by default float32 zero.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import as_ints


@register("ConstantOfShape", since=9)
class ConstantOfShape(Operator):
    """ONNX ConstantOfShape-9: generate a tensor with given value and shape."""
    attributes = {"value": None}

    def forward(self, ctx, shape):
        value = np.zeros(1, np.float32) if self.value is None else np.asarray(self.value)
        if value.size != 1:
            raise ValueError(f"ConstantOfShape: value must hold one element, got shape "
                             f"{value.shape}")
        dims = as_ints(shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"ConstantOfShape: negative dimension in shape {dims}")
        return np.full(dims, value.reshape(-1)[0], dtype=value.dtype)

    def backward(self, ctx, dy):
        return (None,)
