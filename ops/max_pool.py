"""MaxPool (ONNX opset 1+; Indices and storage_order since 8, ceil_mode and dilations since 10).

X (N, C, *in) -> Y (N, C, *out) and Indices: for each output, the flat index of its max in X
(over N, C and the spatial dims, row-major or, with ``storage_order=1``, column-major spatially),
ignoring padding. Ties go to the first max in window order, as in onnx.reference; backward sends
the gradient to that same element.
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, native, register

from . import _window


def lowest(dtype: np.dtype) -> float | int:
    """The padding value no real element loses to."""
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


def spatial_index(win: _window.Window, arg: np.ndarray, order: str) -> np.ndarray:
    """For each output of a (N, C, *out) window argmax, the flat spatial index it points at
    (-1 in padding): looked up in the windows of an index image, not recomputed per pixel."""
    size = math.prod(win.in_shape)
    image = np.arange(size, dtype=np.int64).reshape(win.in_shape, order=order)
    table = _window.windows(_window.pad(image, win, -1), win).reshape(win.size, -1)
    positions = np.arange(table.shape[1]).reshape(win.out_shape)
    return table.reshape(-1)[arg * table.shape[1] + positions]


@register("MaxPool", since=1)
class MaxPool(Operator):
    """ONNX MaxPool-1: MaxPool consumes an input tensor X and applies max pooling across the
    tensor according to kernel sizes, stride sizes, and pad lengths."""
    attributes = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None,
                  "pads": None, "storage_order": 0, "strides": None}

    def window(self, x) -> _window.Window:
        if self.kernel_shape is None:
            raise ValueError(f"MaxPool: the kernel_shape attribute is required (X {list(x.shape)})")
        return _window.geometry("MaxPool", x.shape[2:], self.kernel_shape, self.strides,
                                self.dilations, self.pads, self.auto_pad, self.ceil_mode)

    def forward(self, ctx, x):
        win = self.window(x)
        n, c = x.shape[:2]
        view = _window.windows(_window.pad(x, win, lowest(x.dtype)), win)
        # A running max over the kernel offsets reads the strided view in place; a strict
        # ">" keeps the first max on ties.
        positions = np.ndindex(*win.kernel)
        y = view[(slice(None), slice(None), *next(positions))].copy()
        arg = np.zeros(y.shape, dtype=np.int64)
        for k, pos in enumerate(positions, start=1):
            v = view[(slice(None), slice(None), *pos)]
            better = v > y
            np.copyto(y, v, where=better)
            arg[better] = k
        planes = (np.arange(n * c, dtype=np.int64) * math.prod(win.in_shape)).reshape(
            n, c, *(1,) * len(win.kernel))
        index = spatial_index(win, arg, "C")
        ctx.save(index=planes + index, valid=None if index.min(initial=0) >= 0 else index >= 0,
                 x_shape=x.shape)
        if self.storage_order:
            index = spatial_index(win, arg, "F")
        return y, planes + index

    def backward(self, ctx, dy, dindices=None):
        index, weights = ctx.index.reshape(-1), dy.reshape(-1)
        if ctx.valid is not None:  # a window lying wholly in padding passes nothing back
            index, weights = index[ctx.valid.reshape(-1)], weights[ctx.valid.reshape(-1)]
        dx = np.bincount(index, weights=weights, minlength=math.prod(ctx.x_shape))
        return (dx.reshape(ctx.x_shape).astype(dy.dtype, copy=False),)


def pool_2d(win: _window.Window) -> dict:
    """A 2-D pooling window as the native kernels' keyword arguments."""
    return {"kernel_shape": win.kernel, "strides": win.strides, "dilations": win.dilations,
            "pads_begin": win.pads_begin, "pads_end": win.pads_end, "out": win.out_shape}


@register("MaxPool", since=1, backend="native")
class NativeMaxPool(MaxPool):
    """2-D float max pooling through cpp/include/meta/pool.hpp (every attribute, Indices in
    either storage order); other ranks and dtypes through the numpy implementation."""

    def forward(self, ctx, x):
        win = self.window(x)
        if x.ndim != 4 or not native.supports(x):
            return super().forward(ctx, x)
        x = np.ascontiguousarray(x)
        y, index, indices = native.module().max_pool_forward(
            x, storage_order=bool(self.storage_order), **pool_2d(win))
        ctx.save(native=True, win=win, index=index, x_shape=x.shape)
        return y, indices

    def backward(self, ctx, dy, dindices=None):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dy, dindices)
        return (native.module().max_pool_backward(
            ctx.index, np.ascontiguousarray(dy), x_shape=ctx.x_shape, **pool_2d(ctx.win)),)
