"""Slice: numpy-style slicing per axis; starts/ends/axes are attributes (opsets 1-9) or int64
inputs with optional steps (10+).

Indices follow the ONNX rules, which are Python's: negative values count from the end, values
past either end are clamped (INT64_MAX means "to the end"), and a negative step walks backward.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import as_ints, normalize_axes


@register("Slice", since=10)
class Slice(Operator):
    """ONNX Slice-10: produces a slice of the input tensor along multiple axes."""
    def forward(self, ctx, x, starts, ends, axes=None, steps=None):
        starts, ends = as_ints(starts), as_ints(ends)
        axes = as_ints(axes) if axes is not None else list(range(len(starts)))
        steps = as_ints(steps) if steps is not None else [1] * len(starts)
        if not len(starts) == len(ends) == len(axes) == len(steps):
            raise ValueError(f"Slice: starts {starts}, ends {ends}, axes {axes} and steps {steps} "
                             "must have the same length")
        normalize_axes(axes, x.ndim, self.op_type)  # range and repetition checks
        index = [slice(None)] * x.ndim
        for start, end, axis, step in zip(starts, ends, axes, steps):
            if step == 0:
                raise ValueError(f"Slice: step 0 on axis {axis}")
            index[axis] = slice(start, end, step)
        index = tuple(index)
        ctx.save(index=index, shape=x.shape)
        return x[index]

    def backward(self, ctx, dy):
        if dy is None:
            return (None,) * 5
        dx = np.zeros(ctx.shape, dy.dtype)
        dx[ctx.index] = dy  # a slice never repeats an element, so assignment is enough
        return (dx, None, None, None, None)


@register("Slice", since=1)
class Slice1(Slice):
    """ONNX Slice-1: produces a slice of the input tensor along multiple axes."""
    attributes = {"starts": None, "ends": None, "axes": None}

    def forward(self, ctx, x):
        if self.starts is None or self.ends is None:
            raise ValueError("Slice: the starts and ends attributes are required")
        return super().forward(ctx, x, self.starts, self.ends, self.axes)
