"""Shared shapes of elementwise operators: unary y = f(x), and binary ops with broadcasting."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from meta.lv0 import Operator


class Unary(Operator):
    """y = f(x) elementwise; backward multiplies by f'(x), written from x or from y.

    Subclasses implement ``function`` and ``derivative(x, y)``; ``keep`` names what the
    derivative reads ("x", "y" or both), and only that is saved.
    """

    keep: ClassVar[tuple[str, ...]] = ("y",)

    def function(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def derivative(self, x: np.ndarray | None, y: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def forward(self, ctx, x):
        y = np.asarray(self.function(x)).astype(x.dtype, copy=False)
        ctx.save(x=x if "x" in self.keep else None, y=y if "y" in self.keep else None)
        return y

    def backward(self, ctx, dy):
        return ((dy * self.derivative(ctx.x, ctx.y)).astype(dy.dtype, copy=False),)


def broadcast_shape(op: str, *arrays: np.ndarray) -> tuple[int, ...]:
    """The numpy broadcast of the inputs' shapes, or an error naming ``op`` and every shape."""
    try:
        return np.broadcast_shapes(*(np.shape(a) for a in arrays))
    except ValueError as err:
        shapes = ", ".join(str(np.shape(a)) for a in arrays)
        raise ValueError(f"{op}: cannot broadcast input shapes {shapes}") from err
