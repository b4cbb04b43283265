"""AveragePool (ONNX opset 1+; count_include_pad since 7, ceil_mode since 10, dilations 19).

Each output is the mean of its window. The divisor counts the input elements in the window
and, with ``count_include_pad=1``, the explicit (or auto_pad) padding too, never the room
``ceil_mode`` adds past it, as onnx.reference does.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, native, register

from . import _window
from .max_pool import pool_2d


@register("AveragePool", since=1)
class AveragePool(Operator):
    """ONNX AveragePool-1: AveragePool consumes an input tensor X and applies average pooling
    across the tensor according to kernel sizes, stride sizes, and pad lengths."""
    attributes = {"auto_pad": "NOTSET", "ceil_mode": 0, "count_include_pad": 0,
                  "dilations": None, "kernel_shape": None, "pads": None, "strides": None}

    def window(self, x) -> _window.Window:
        if self.kernel_shape is None:
            raise ValueError(f"AveragePool: the kernel_shape attribute is required "
                             f"(X {list(x.shape)})")
        return _window.geometry("AveragePool", x.shape[2:], self.kernel_shape, self.strides,
                                self.dilations, self.pads, self.auto_pad, self.ceil_mode)

    def forward(self, ctx, x):
        win = self.window(x)
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


@register("AveragePool", since=1, backend="native")
class NativeAveragePool(AveragePool):
    """2-D float average pooling through cpp/include/meta/pool.hpp; other ranks and dtypes
    through the numpy implementation."""

    def forward(self, ctx, x):
        win = self.window(x)
        if x.ndim != 4 or not native.supports(x):
            return super().forward(ctx, x)
        ctx.save(native=True, win=win, x_shape=x.shape)
        return native.module().average_pool_forward(
            np.ascontiguousarray(x), count_include_pad=bool(self.count_include_pad),
            **pool_2d(win))

    def backward(self, ctx, dy):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dy)
        return (native.module().average_pool_backward(
            np.ascontiguousarray(dy), x_shape=ctx.x_shape,
            count_include_pad=bool(self.count_include_pad), **pool_2d(ctx.win)),)
