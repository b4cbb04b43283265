"""AveragePool (ONNX opset 1+; count_include_pad since 7, ceil_mode since 10, dilations 19).

Each output is the mean of its window. The divisor counts the input elements in the window
and, with ``count_include_pad=1``, the explicit (or auto_pad) padding too, never the room
``ceil_mode`` adds past it, as onnx.reference does.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register
from ops import _window


@register("AveragePool", since=1)
class AveragePool(Operator):
    attributes = {"auto_pad": "NOTSET", "ceil_mode": 0, "count_include_pad": 0,
                  "dilations": None, "kernel_shape": None, "pads": None, "strides": None}

    def forward(self, ctx, x):
        if self.kernel_shape is None:
            raise ValueError(f"AveragePool: the kernel_shape attribute is required "
                             f"(X {list(x.shape)})")
        win = _window.geometry("AveragePool", x.shape[2:], self.kernel_shape, self.strides,
                               self.dilations, self.pads, self.auto_pad, self.ceil_mode)
        rank = len(win.kernel)
        kernel_axes = tuple(range(-2 * rank, -rank))
        sums = _window.windows(_window.pad(x, win), win).sum(axis=kernel_axes)
        counted = np.zeros(win.padded_shape, dtype=x.dtype)
        if self.count_include_pad:
            counted[tuple(slice(0, i + b + e) for i, b, e in
                          zip(win.in_shape, win.pads_begin, win.pads_end))] = 1
        else:
            counted[tuple(slice(b, b + i) for b, i in zip(win.pads_begin, win.in_shape))] = 1
        divisor = _window.windows(counted, win).sum(axis=kernel_axes)
        ctx.save(win=win, divisor=divisor)
        return (sums / divisor).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        win = ctx.win
        rank = len(win.kernel)
        share = (dy / ctx.divisor)[(slice(None), slice(None), *(None,) * rank)]
        dcols = np.broadcast_to(share, (*dy.shape[:2], *win.kernel, *dy.shape[2:]))
        return (np.ascontiguousarray(_window.unpad(_window.col2im(dcols, win), win)),)
