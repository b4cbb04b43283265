"""The reductions beyond ReduceSum/ReduceMean: each a forward over axes (keepdims) and a
gradient written from x, the kept-dims result and the kept-dims dy. Axes and empty-axes rules
come from ``_reduce.Reduce``; a reduction over an empty set gives the reduction's identity
(0, 1, -inf for max, +inf for min), as ONNX specifies from opset 18. With
``noop_with_empty_axes`` and no axes, nothing is reduced but the elementwise part still applies
(ReduceSumSquare squares), as onnx.reference and onnxruntime do.
"""

from __future__ import annotations

import numpy as np

from ._reduce import Reduce


def lowest(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind == "b":
        return False
    return np.iinfo(dtype).min


def highest(dtype: np.dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.inf
    if dtype.kind == "b":
        return True
    return np.iinfo(dtype).max


class Reduction(Reduce):
    """Subclasses implement ``compute(x, axes)`` (keepdims) and ``gradient(x, y, dy)``."""

    def compute(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """The reduction of ``x`` over ``axes``, keeping them as size-1 dimensions."""
        raise NotImplementedError

    def gradient(self, x: np.ndarray, y: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """The gradient of ``x`` given the kept-dims output ``y`` and its gradient ``dy``."""
        raise NotImplementedError

    def forward(self, ctx, x, axes=None):
        reduced = self._axes(x, axes)
        if reduced is None:  # noop_with_empty_axes: the elementwise part alone, as onnx.reference
            reduced = ()
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = np.asarray(self.compute(x, reduced)).astype(x.dtype, copy=False)
        ctx.save(reduced=reduced, x=x, y=y)
        return y if self.keepdims else y.reshape([n for i, n in enumerate(x.shape)
                                                  if i not in reduced])

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        dy = dy.reshape(ctx.y.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            dx = self.gradient(ctx.x, ctx.y, dy)
        return (np.ascontiguousarray(np.broadcast_to(dx, ctx.x.shape), dtype=dy.dtype), None)


class Extreme(Reduction):
    """ReduceMax / ReduceMin: ties share the gradient equally (as PyTorch's amax does)."""

    largest = True

    def compute(self, x, axes):
        if self.largest:
            return np.max(x, axis=axes, keepdims=True, initial=lowest(x.dtype))
        return np.min(x, axis=axes, keepdims=True, initial=highest(x.dtype))

    def gradient(self, x, y, dy):
        hit = x == y
        return dy * hit / hit.sum(axis=self._reduced_axes(x, y), keepdims=True)

    @staticmethod
    def _reduced_axes(x, y):
        return tuple(i for i, (a, b) in enumerate(zip(x.shape, y.shape)) if a != b or a == 1)
