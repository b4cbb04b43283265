"""Concat: join inputs along ``axis`` (ONNX opset 4+; negative axes as from opset 11)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("Concat", since=4)
class Concat(Operator):
    """ONNX Concat-4: concatenate a list of tensors into a single tensor."""
    attributes = {"axis": None}

    def forward(self, ctx, *inputs):
        if self.axis is None:
            raise ValueError("Concat: the axis attribute is required")
        if not inputs:
            raise ValueError("Concat: needs at least one input")
        rank = inputs[0].ndim
        axis = normalize_axis(self.axis, rank, self.op_type)
        shapes = [x.shape for x in inputs]
        rest = {s[:axis] + s[axis + 1:] if len(s) == rank else None for s in shapes}
        if len(rest) != 1 or None in rest:
            raise ValueError(f"Concat: inputs of shapes {shapes} differ outside axis {self.axis}")
        ctx.save(axis=axis, sizes=[s[axis] for s in shapes])
        return np.concatenate(inputs, axis=axis)

    def backward(self, ctx, dy):
        if dy is None:
            return (None,) * len(ctx.sizes)
        pieces = np.split(dy, np.cumsum(ctx.sizes)[:-1], axis=ctx.axis)
        return tuple(p if ctx.needs(i) else None for i, p in enumerate(pieces))
