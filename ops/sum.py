"""Sum: elementwise sum of any number of inputs, with numpy broadcasting.

Registered from opset 6, whose inputs must share one shape; broadcasting (opset 8) is a
superset of that.
"""

from __future__ import annotations

import functools
import operator

from meta.lv0 import Operator, register, unbroadcast

from ._elementwise import broadcast_shape


@register("Sum", since=6)
class Sum(Operator):
    """ONNX Sum-6: element-wise sum of each of the input tensors."""
    def forward(self, ctx, *inputs):
        if not inputs:
            raise ValueError("Sum: needs at least one input")
        broadcast_shape(self.op_type, *inputs)
        ctx.save(shapes=[x.shape for x in inputs])
        return functools.reduce(operator.add, inputs)

    def backward(self, ctx, dy):
        return tuple(unbroadcast(dy, s) if ctx.needs(i) else None
                     for i, s in enumerate(ctx.shapes))
