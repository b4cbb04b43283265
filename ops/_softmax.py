"""Axis handling shared by Softmax and LogSoftmax in both of their ONNX forms.

From opset 13 they normalise along one axis (default -1). Before, the input is coerced to 2-D
at ``axis`` (default 1) - shape (prod(shape[:axis]), prod(shape[axis:])) - and normalised over
the second dimension, i.e. over all of ``shape[axis:]`` at once.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from meta.lv0 import Operator

from ._axes import normalize_axis

# The native kernels win on small inputs (no numpy call overheads: 128x10 about 2x faster) but
# lose to numpy's AVX-512 exp on large ones (128x1000 about 2.5x slower on this machine), so
# their twins take only inputs up to this size.
NATIVE_MAX_SIZE = 1 << 14


def softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


class Normalizer(Operator):
    """A softmax-like op; subclasses give ``compute(x, axis)`` and ``gradient(y, dy, axis)``."""

    attributes = {"axis": -1}
    coerce_2d: ClassVar[bool] = False

    def compute(self, x: np.ndarray, axis: int) -> np.ndarray:
        """The normalized output along ``axis`` (the forward)."""
        raise NotImplementedError

    def gradient(self, y: np.ndarray, dy: np.ndarray, axis: int) -> np.ndarray:
        """The input's gradient from the output ``y`` and its gradient ``dy``."""
        raise NotImplementedError

    def forward(self, ctx, x):
        axis = normalize_axis(self.axis, x.ndim, self.op_type)
        if self.coerce_2d:
            view, along = x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), 1
        else:
            view, along = x, axis
        y = self.compute(view, along)
        ctx.save(y=y, along=along)
        return y.reshape(x.shape)

    def backward(self, ctx, dy):
        return (self.gradient(ctx.y, dy.reshape(ctx.y.shape), ctx.along).reshape(dy.shape),)
