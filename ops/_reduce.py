"""ReduceSum / ReduceMean: axes as an attribute (older opsets) or an int64 input (newer ones).

Empty or absent axes reduce over every axis, unless ``noop_with_empty_axes`` (input forms only)
makes the op an identity. The gradient spreads ``dy`` back over the reduced axes.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from meta.lv0 import Operator

from ._axes import as_ints, normalize_axes


class Reduce(Operator):
    """Base of the reductions; subclasses set ``mean`` and the ``axes_from`` form."""

    attributes = {"keepdims": 1, "noop_with_empty_axes": 0}
    mean: ClassVar[bool] = False
    axes_from: ClassVar[str] = "input"  # or "attribute"

    def _axes(self, x: np.ndarray, axes_input: np.ndarray | None) -> tuple[int, ...] | None:
        axes = as_ints(self.axes if self.axes_from == "attribute" else axes_input)
        if not axes:  # absent or empty
            return None if getattr(self, "noop_with_empty_axes", 0) else tuple(range(x.ndim))
        return normalize_axes(axes, x.ndim, self.op_type)

    def forward(self, ctx, x, axes=None):
        reduced = self._axes(x, axes)
        if reduced is None:
            ctx.save(reduced=None)
            return x
        fn = np.mean if self.mean else np.sum
        y = np.asarray(fn(x, axis=reduced, keepdims=bool(self.keepdims)), dtype=x.dtype)
        ctx.save(reduced=reduced, shape=x.shape)
        return y

    def backward(self, ctx, dy):
        if ctx.reduced is None:
            return (dy, None)
        kept = [1 if i in ctx.reduced else n for i, n in enumerate(ctx.shape)]
        dx = np.broadcast_to(dy.reshape(kept), ctx.shape)
        if self.mean:
            count = math.prod(ctx.shape[i] for i in ctx.reduced)
            return (dx / max(count, 1), None)
        return (dx.copy(), None)
