"""CenterCropPad (ONNX opset 18+): crop or zero-pad each of ``axes`` (default all) to
``shape``, centred (an odd difference puts the extra element at the end).
Backward: dY's part that came from X, put back where it was."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("CenterCropPad", since=18)
class CenterCropPad(Operator):
    """ONNX CenterCropPad-18: center crop or pad an input to given dimensions."""
    attributes = {"axes": None}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, shape):
        axes = range(x.ndim) if self.axes is None else [a % x.ndim for a in self.axes]
        sizes = [int(v) for v in np.reshape(shape, -1)]
        if len(sizes) != len(list(axes)):
            raise ValueError(f"CenterCropPad: shape {sizes} needs one size per axis {list(axes)}")
        crop = [slice(None)] * x.ndim
        place = [slice(None)] * x.ndim
        out_shape = list(x.shape)
        for axis, size in zip(axes, sizes):
            n = x.shape[axis]
            out_shape[axis] = size
            start = abs(n - size) // 2
            window = slice(start, start + min(n, size))
            if size < n:
                crop[axis] = window
            elif size > n:
                place[axis] = window
        y = np.zeros(out_shape, x.dtype)
        y[tuple(place)] = x[tuple(crop)]
        ctx.save(crop=tuple(crop), place=tuple(place), x_shape=x.shape)
        return y

    def backward(self, ctx, dy):
        dx = np.zeros(ctx.x_shape, dy.dtype)
        dx[ctx.crop] = dy[ctx.place]
        return (dx, None)
