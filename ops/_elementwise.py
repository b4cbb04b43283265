"""Shared shapes of elementwise operators: unary y = f(x), and binary ops with broadcasting; the
helpers their native (C++) twins share."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from meta.lv0 import Operator, native


def f32(value: float) -> float:
    """An ONNX float attribute as the float32 a model file stores, so a graph built in code
    computes what the same graph loaded from a file computes."""
    return float(np.float32(value))


class Unary(Operator):
    """y = f(x) elementwise; backward multiplies by f'(x), written from x or from y.

    Subclasses implement ``function`` and ``derivative(x, y)``; ``keep`` names what the
    derivative reads ("x", "y" or both), and only that is saved.
    """

    keep: ClassVar[tuple[str, ...]] = ("y",)

    def function(self, x: np.ndarray) -> np.ndarray:
        """f(x), elementwise (the forward)."""
        raise NotImplementedError

    def derivative(self, x: np.ndarray | None, y: np.ndarray | None) -> np.ndarray:
        """f'(x), elementwise, from the input ``x`` or the output ``y`` (whichever ``keep``
        names; the other is ``None``)."""
        raise NotImplementedError

    def forward(self, ctx, x):
        y = np.asarray(self.function(x)).astype(x.dtype, copy=False)
        ctx.save(x=x if "x" in self.keep else None, y=y if "y" in self.keep else None)
        return y

    def backward(self, ctx, dy):
        if dy is None:  # an integer or bool output: nothing flows back
            return (None,)
        return ((dy * self.derivative(ctx.x, ctx.y)).astype(dy.dtype, copy=False),)


def broadcast_shape(op: str, *arrays: np.ndarray) -> tuple[int, ...]:
    """The numpy broadcast of the inputs' shapes, or an error naming ``op`` and every shape."""
    try:
        return np.broadcast_shapes(*(np.shape(a) for a in arrays))
    except ValueError as err:
        shapes = ", ".join(str(np.shape(a)) for a in arrays)
        raise ValueError(f"{op}: cannot broadcast input shapes {shapes}") from err


def contiguous(x: np.ndarray) -> np.ndarray:
    """x as the C-contiguous array a native kernel reads: x itself when it already is one (and a
    0-d array stays 0-d, which np.ascontiguousarray would make 1-d)."""
    x = np.asarray(x)  # numpy scalars too
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


class NativeUnary(Unary):
    """A unary op's native twin: ``kernel`` names ``<kernel>_forward`` and ``<kernel>_backward``
    in meta._native, the backward reading what ``keep`` names (one of x, y). Other dtypes
    take the numpy path."""

    kernel: ClassVar[str] = ""

    def options(self) -> dict:
        return {}

    def forward(self, ctx, x):
        if not native.supports(x):
            return super().forward(ctx, x)
        x = contiguous(x)
        y = getattr(native.module(), f"{self.kernel}_forward")(x, **self.options())
        ctx.save(x=x if "x" in self.keep else None, y=y if "y" in self.keep else None)
        return y

    def backward(self, ctx, dy):
        saved = ctx.x if "x" in self.keep else ctx.y
        if not native.supports(saved, dy):
            return super().backward(ctx, dy)
        kernel = getattr(native.module(), f"{self.kernel}_backward")
        return (kernel(contiguous(saved), contiguous(dy), **self.options()),)
