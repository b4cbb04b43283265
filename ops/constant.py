"""Constant: a tensor given by exactly one attribute (ONNX opset 1+; the value_* forms are 12+).

``value`` is a tensor; value_float(s) become float32, value_int(s) int64, value_string(s)
strings. Sparse tensors are not supported. No inputs, so nothing to differentiate.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

_TYPED = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
          "value_ints": np.int64, "value_string": np.str_, "value_strings": np.str_}


@register("Constant", since=1)
class Constant(Operator):
    """ONNX Constant-1: A constant tensor."""
    attributes = {"value": None, "sparse_value": None, **dict.fromkeys(_TYPED)}

    def __init__(self, **attrs):
        super().__init__(**attrs)
        given = [name for name in self.attributes if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"Constant: exactly one of {', '.join(self.attributes)} must be "
                             f"set, got {given or 'none'}")
        if given[0] == "sparse_value":
            raise NotImplementedError("Constant: sparse_value is not supported")
        name = given[0]
        self._tensor = np.asarray(getattr(self, name), dtype=_TYPED.get(name))

    def forward(self, ctx):
        return self._tensor

    def backward(self, ctx, dy):
        return ()
