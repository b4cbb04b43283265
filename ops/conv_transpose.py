"""ConvTranspose (ONNX opset 1+): the adjoint of Conv, as GEMM + col2im.

X (N, C, *in), W (C, M/group, *kernel), optional B (M) -> Y (N, M, *out) with
``out = stride * (in - 1) + output_padding + (kernel - 1) * dilation + 1 - pads``, or ``out =
output_shape`` whose pads are then derived as the spec says. The full (unpadded) output is the
padded input of the matching Conv window, so ``ops._window`` serves both directions.
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register

from . import _window
from .conv import check_conv_shapes, kernel_of


@register("ConvTranspose", since=1)
class ConvTranspose(Operator):
    """ONNX ConvTranspose-1: the convolution transpose operator consumes an input tensor and a
    filter, and computes the output."""
    learnable_inputs = (1, 2)  # weight W and bias B
    attributes = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                  "output_padding": None, "output_shape": None, "pads": None, "strides": None}

    def geometry(self, x_shape: tuple[int, ...], kernel: tuple[int, ...]) -> _window.Window:
        op, rank = "ConvTranspose", len(kernel)
        spatial = tuple(x_shape[2:])
        strides = _window._per_dim(op, "strides", self.strides, rank, 1)
        dilations = _window._per_dim(op, "dilations", self.dilations, rank, 1)
        extra = _window._per_dim(op, "output_padding", self.output_padding, rank, 0)
        full = [s * (i - 1) + o + (k - 1) * d + 1
                for s, i, o, k, d in zip(strides, spatial, extra, kernel, dilations)]
        auto_pad = self.auto_pad or "NOTSET"
        if auto_pad not in _window.AUTO_PADS:
            raise ValueError(f"{op}: auto_pad must be one of {', '.join(_window.AUTO_PADS)}, "
                             f"got {auto_pad!r}")
        out_shape = self.output_shape
        if out_shape is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out_shape = [i * s for i, s in zip(spatial, strides)]
        if out_shape is not None:
            out_shape = list(out_shape)[-rank:]  # a full (N, C, ...) shape is allowed too
            total = [f - o for f, o in zip(full, out_shape)]
            if min(total) < 0:
                raise ValueError(f"{op}: output_shape {out_shape} is larger than the full "
                                 f"output {full} of X {list(x_shape)}")
            small, big = [t // 2 for t in total], [t - t // 2 for t in total]
            begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
        elif auto_pad == "VALID":
            begin = end = [0] * rank
        else:
            pads = _window._per_dim(op, "pads", self.pads, rank, 0, 2 * rank)
            begin, end = list(pads[:rank]), list(pads[rank:])
        out = [f - b - e for f, b, e in zip(full, begin, end)]
        if min(out) <= 0:
            raise ValueError(f"{op}: pads {begin + end} leave no output from X {list(x_shape)}")
        return _window.Window(tuple(out), kernel, strides, dilations, tuple(begin), tuple(end),
                              spatial, (0,) * rank)

    def forward(self, ctx, x, w, b=None):
        g = self.group
        check_conv_shapes("ConvTranspose", x, w, g, 0)
        m = w.shape[1] * g
        if b is not None and b.shape != (m,):
            raise ValueError(f"ConvTranspose: B {list(b.shape)} must be ({m},) for W "
                             f"{list(w.shape)} and group={g}")
        win = self.geometry(x.shape, kernel_of("ConvTranspose", w, self.kernel_shape))
        n, c, rank = x.shape[0], x.shape[1], len(win.kernel)
        xg = x.reshape(n, g, c // g, -1)  # (N, G, Cg, P_in)
        cols = np.matmul(w.reshape(g, c // g, -1).transpose(0, 2, 1), xg)  # (N, G, Mg*K, P_in)
        full = _window.col2im(cols.reshape(n, m, *win.kernel, *win.out_shape), win)
        y = np.ascontiguousarray(_window.unpad(full, win))
        if b is not None:
            y += b.reshape(m, *(1,) * rank)
        ctx.save(win=win, xg=xg, w=w, x_shape=x.shape, has_bias=b is not None)
        return y

    def backward(self, ctx, dy):
        win, g, w = ctx.win, self.group, ctx.w
        n, c = ctx.x_shape[:2]
        # The windows of the zero-padded dY are exactly what each input pixel wrote to.
        dcols = _window.windows(_window.pad(dy, win), win).reshape(
            n, g, -1, math.prod(win.out_shape))  # (N, G, Mg*K, P_in)
        dx = dw = db = None
        if ctx.needs(0):
            dx = np.matmul(w.reshape(g, c // g, -1), dcols).reshape(ctx.x_shape)
        if ctx.needs(1):
            dw = np.matmul(ctx.xg, dcols.transpose(0, 1, 3, 2)).sum(axis=0).reshape(w.shape)
        if ctx.has_bias and ctx.needs(2):
            db = dy.sum(axis=(0, *range(2, dy.ndim)))
        return (dx, dw, db)
