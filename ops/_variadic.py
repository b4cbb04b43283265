"""Shared shape of Max and Min: a variadic elementwise choice with broadcasting.

The gradient goes to the input that was chosen; on a tie, to the first of them (as PyTorch's
max(a, b) splits nothing and picks one).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import numpy as np

from meta.lv0 import Operator, unbroadcast

from ._elementwise import broadcast_shape


class Choose(Operator):
    pick: ClassVar[Callable[[np.ndarray, np.ndarray], np.ndarray]]

    def forward(self, ctx, *xs):
        if not xs:
            raise ValueError(f"{self.op_type}: needs at least one input")
        shape = broadcast_shape(self.op_type, *xs)
        y = xs[0]
        for x in xs[1:]:
            y = type(self).pick(y, x)
        y = np.broadcast_to(y, shape).copy() if y.shape != shape else np.asarray(y)
        ctx.save(xs=xs, y=y)
        return y

    def backward(self, ctx, dy):
        if dy is None:
            return (None,) * len(ctx.xs)
        taken = np.zeros(dy.shape, bool)
        grads = []
        for i, x in enumerate(ctx.xs):
            mine = (np.broadcast_to(x, dy.shape) == ctx.y) & ~taken
            taken |= mine
            grads.append(unbroadcast(np.where(mine, dy, 0).astype(dy.dtype), x.shape)
                         if ctx.needs(i) else None)
        return tuple(grads)
