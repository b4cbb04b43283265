"""Shared shape of the comparison, logic and bitwise operators: numpy broadcasting, a bool
(or integer) result, no gradient."""

from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np

from meta.lv0 import Operator

from ._elementwise import broadcast_shape


class Predicate(Operator):
    """y = fn(a, b) with broadcasting; piecewise constant, so no input gets a gradient."""

    fn: ClassVar[Callable[..., np.ndarray]]
    no_grad_inputs = (0, 1)

    def forward(self, ctx, *inputs):
        broadcast_shape(self.op_type, *inputs)
        return np.asarray(type(self).fn(*inputs))

    def backward(self, ctx, *grads):
        return (None, None)
