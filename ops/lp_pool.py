"""LpPool (ONNX opsets 2+; ceil_mode and dilations from 18): the p-norm of each window,
``(sum |x|^p)^(1/p)``, padding counting as zeros.

Backward: ``dy * y^(1-p) * |x|^(p-1) * sign(x)`` summed over the windows each input is in
(zero where a window's norm is zero).
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from . import _window


@register("LpPool", since=2)
class LpPool(Operator):
    """ONNX LpPool-2: LpPool consumes an input tensor X and applies Lp pooling across the tensor
    according to kernel sizes, stride sizes, and pad lengths."""
    attributes = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None,
                  "p": 2, "pads": None, "strides": None}

    def forward(self, ctx, x):
        if self.kernel_shape is None:
            raise ValueError(f"LpPool: the kernel_shape attribute is required (X "
                             f"{list(x.shape)})")
        win = _window.geometry("LpPool", x.shape[2:], self.kernel_shape, self.strides,
                               self.dilations, self.pads, self.auto_pad, self.ceil_mode)
        rank = len(win.kernel)
        p = float(self.p)
        powered = np.abs(x) ** p
        sums = _window.windows(_window.pad(powered, win), win).sum(
            axis=tuple(range(-2 * rank, -rank)))
        y = (sums ** (1.0 / p)).astype(x.dtype, copy=False)
        ctx.save(x=x, y=y, win=win)
        return y

    def backward(self, ctx, dy):
        x, y, win, p = ctx.x, ctx.y, ctx.win, float(self.p)
        rank = len(win.kernel)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(y == 0, 0, dy * y ** (1 - p))
        cols = np.broadcast_to(share[(slice(None), slice(None), *(None,) * rank)],
                               (*dy.shape[:2], *win.kernel, *dy.shape[2:]))
        spread = _window.unpad(_window.col2im(cols, win), win)
        dx = spread * np.abs(x) ** (p - 1) * np.sign(x)
        return (dx.astype(x.dtype, copy=False),)
