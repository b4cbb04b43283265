"""Squeeze: drop size-1 axes - the listed ones, or all of them when none are listed.

Axes are an attribute before opset 13 and an optional int64 input from 13.
"""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._axes import as_ints, normalize_axes


@register("Squeeze", since=13)
class Squeeze(Operator):
    """ONNX Squeeze-13: remove single-dimensional entries from the shape of a tensor."""
    def forward(self, ctx, x, axes=None):
        axes = as_ints(axes)
        if axes is None:
            axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
        else:
            axes = normalize_axes(axes, x.ndim, self.op_type)
            if any(x.shape[a] != 1 for a in axes):
                raise ValueError(f"Squeeze: cannot squeeze axes {list(axes)} of shape {x.shape}: "
                                 "a squeezed axis must have size 1")
        ctx.save(shape=x.shape)
        return x.reshape([n for i, n in enumerate(x.shape) if i not in axes])

    def backward(self, ctx, dy):
        return (None if dy is None else dy.reshape(ctx.shape), None)


@register("Squeeze", since=1)
class Squeeze1(Squeeze):
    """ONNX Squeeze-1: remove single-dimensional entries from the shape of a tensor."""
    attributes = {"axes": None}

    def forward(self, ctx, x):
        return super().forward(ctx, x, self.axes)
