"""Unsqueeze: insert size-1 axes at the given positions of the output.

Axes (required; negative ones count from the end of the output's rank) are an attribute before
opset 13 and an int64 input from 13.
"""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._axes import as_ints, normalize_axes


@register("Unsqueeze", since=13)
class Unsqueeze(Operator):
    """ONNX Unsqueeze-13: insert single-dimensional entries to the shape of an input tensor
    (data)."""
    def forward(self, ctx, x, axes=None):
        axes = as_ints(axes)
        if axes is None:
            raise ValueError("Unsqueeze: axes are required")
        rank = x.ndim + len(axes)
        inserted = normalize_axes(axes, rank, self.op_type)
        rest = iter(x.shape)
        ctx.save(shape=x.shape)
        return x.reshape([1 if i in inserted else next(rest) for i in range(rank)])

    def backward(self, ctx, dy):
        return (None if dy is None else dy.reshape(ctx.shape), None)


@register("Unsqueeze", since=1)
class Unsqueeze1(Unsqueeze):
    """ONNX Unsqueeze-1: insert single-dimensional entries to the shape of a tensor."""
    attributes = {"axes": None}

    def forward(self, ctx, x):
        return super().forward(ctx, x, self.axes)
