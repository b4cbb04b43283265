"""OptionalHasElement (ONNX opset 15+; 18 takes tensors and an absent input): whether the
optional holds a value, bool scalar."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("OptionalHasElement", since=15)
class OptionalHasElement(Operator):
    """ONNX OptionalHasElement-15: returns true if the optional-type input contains an element."""
    no_grad_inputs = (0,)

    def forward(self, ctx, value=None):
        return np.array(value is not None)
