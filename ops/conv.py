"""Conv (ONNX opset 1+; 11 only clarified defaults): N-D grouped convolution as im2col + GEMM.

X (N, C, *in), W (M, C/group, *kernel), optional B (M) -> Y (N, M, *out). The windows are a
strided view of the padded input (``ops._window``); one batched matmul per call does the work.
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, native, register

from . import _window


def check_conv_shapes(op: str, x: np.ndarray, w: np.ndarray, group: int,
                      in_channels_axis: int) -> None:
    """Channel and rank agreement of X and W, with an error that names both shapes."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(f"{op}: X {list(x.shape)} and W {list(w.shape)} must both be "
                         f"(N, C, *spatial) / (channels, channels, *kernel) of the same rank >= 3")
    channels = w.shape[in_channels_axis] * (group if in_channels_axis == 1 else 1)
    if x.shape[1] != channels or x.shape[1] % group:
        raise ValueError(f"{op}: X {list(x.shape)} has {x.shape[1]} channels but W "
                         f"{list(w.shape)} with group={group} expects {channels}")


def kernel_of(op: str, w: np.ndarray, kernel_shape) -> tuple[int, ...]:
    kernel = tuple(w.shape[2:])
    if kernel_shape is not None and tuple(kernel_shape) != kernel:
        raise ValueError(f"{op}: kernel_shape {list(kernel_shape)} does not match W "
                         f"{list(w.shape)}")
    return kernel


@register("Conv", since=1)
class Conv(Operator):
    """ONNX Conv-1: the convolution operator consumes an input tensor and a filter, and computes
    the output."""
    learnable_inputs = (1, 2)  # weight W and bias B
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "pads": None, "strides": None}

    def window(self, x, w, b=None) -> _window.Window:
        """Check X, W and B against each other and resolve the window (shared by both
        backends, so their errors are the same)."""
        g = self.group
        check_conv_shapes("Conv", x, w, g, 1)
        if w.shape[0] % g:
            raise ValueError(f"Conv: W {list(w.shape)} has {w.shape[0]} output channels, not a "
                             f"multiple of group={g}")
        if b is not None and b.shape != (w.shape[0],):
            raise ValueError(f"Conv: B {list(b.shape)} must be ({w.shape[0]},) for W "
                             f"{list(w.shape)}")
        return _window.geometry("Conv", x.shape[2:], kernel_of("Conv", w, self.kernel_shape),
                                self.strides, self.dilations, self.pads, self.auto_pad)

    def forward(self, ctx, x, w, b=None):
        g, win = self.group, self.window(x, w, b)
        n, m, rank = x.shape[0], w.shape[0], len(win.kernel)
        # im2col: (N, C, *k, *out) windows copied to (N, G, Cg*K, P), one GEMM per image and
        # group whose result is already laid out as (N, M, *out).
        rows = x.shape[1] // g * math.prod(win.kernel)  # explicit: -1 is ambiguous when N = 0
        cols = _window.windows(_window.pad(x, win), win).reshape(n, g, rows, math.prod(
            win.out_shape))
        y = np.matmul(w.reshape(g, m // g, -1), cols).reshape(n, m, *win.out_shape)
        if b is not None:
            y += b.reshape(m, *(1,) * rank)
        ctx.save(win=win, cols=cols, w=w, x_shape=x.shape, has_bias=b is not None)
        return y

    def backward(self, ctx, dy):
        win, g, w = ctx.win, self.group, ctx.w
        n, c = ctx.x_shape[:2]
        m = w.shape[0]
        dyg = dy.reshape(n, g, m // g, math.prod(win.out_shape))  # (N, G, M/G, P)
        dx = dw = db = None
        if ctx.needs(0):
            wg = w.reshape(g, m // g, -1)
            dcols = np.matmul(wg.transpose(0, 2, 1), dyg)  # (N, G, Cg*K, P)
            dxp = _window.col2im(dcols.reshape(n, c, *win.kernel, *win.out_shape), win)
            dx = np.ascontiguousarray(_window.unpad(dxp, win))
        if ctx.needs(1):
            dw = np.matmul(dyg, ctx.cols.transpose(0, 1, 3, 2)).sum(axis=0).reshape(w.shape)
        if ctx.has_bias and ctx.needs(2):
            db = dy.sum(axis=(0, *range(2, dy.ndim)))
        return (dx, dw, db)


def native_arrays(*arrays: np.ndarray | None) -> tuple[np.ndarray | None, ...] | None:
    """The arrays as C-contiguous float32/float64 of one dtype, or None when a kernel cannot
    take them as they are (mixed or other dtypes: the numpy implementation decides)."""
    if not native.supports(*(a for a in arrays if a is not None)):
        return None
    return tuple(None if a is None else np.ascontiguousarray(a) for a in arrays)


def spatial_2d(win: _window.Window) -> dict:
    """A 2-D window as the native kernels' keyword arguments."""
    return {"strides": win.strides, "dilations": win.dilations, "pads": win.pads_begin,
            "out": win.out_shape}


@register("Conv", since=1, backend="native")
class NativeConv(Conv):
    """2-D convolutions through cpp/include/meta/conv.hpp (im2col of a few images at a time +
    BLAS GEMMs); other ranks and dtypes through the numpy implementation. Keeps only X and W
    for backward and recomputes the columns there, as PyTorch does."""

    def forward(self, ctx, x, w, b=None):
        win = self.window(x, w, b)
        arrays = native_arrays(x, w, b) if x.ndim == 4 else None
        if arrays is None:
            return super().forward(ctx, x, w, b)
        x, w, b = arrays
        y = native.module().conv_forward(x, w, b, group=self.group, **spatial_2d(win))
        ctx.save(native=True, win=win, x=x, w=w, has_bias=b is not None)
        return y

    def backward(self, ctx, dy):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dy)
        need_b = ctx.has_bias and ctx.needs(2)
        return native.module().conv_backward(
            ctx.x, ctx.w, np.ascontiguousarray(dy, dtype=ctx.x.dtype), group=self.group,
            need_x=ctx.needs(0), need_w=ctx.needs(1), need_b=need_b, **spatial_2d(ctx.win))
