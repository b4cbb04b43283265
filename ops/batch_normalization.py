"""BatchNormalization (ONNX opset 14+, ``training_mode``; 15 only widened the types).

Inputs X (N, C, ...), scale, B, input_mean, input_var (C). Inference normalises with the given
statistics. ``training_mode=1`` normalises with the batch mean and (biased) variance, backprops
through them, and also outputs ``running_mean = input_mean * momentum + mean * (1 - momentum)``
and the same for the variance. The statistics are not learned: ``input_mean``/``input_var``
get no gradient, and the running outputs feed nothing in a trained graph (their gradient
into X is still correct, should anything consume them).
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("BatchNormalization", since=14)
class BatchNormalization(Operator):
    attributes = {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}
    no_grad_inputs = (3, 4)

    def forward(self, ctx, x, scale, b, mean, var):
        c = x.shape[1] if x.ndim >= 2 else None
        for name, v in (("scale", scale), ("B", b), ("input_mean", mean), ("input_var", var)):
            if v.shape != (c,):
                raise ValueError(f"BatchNormalization: {name} {list(v.shape)} must be ({c},) "
                                 f"for X {list(x.shape)} (one value per channel)")
        axes = (0, *range(2, x.ndim))
        shape = (c, *(1,) * (x.ndim - 2))
        if self.training_mode:
            mean_used, var_used = x.mean(axis=axes), x.var(axis=axes)
        else:
            mean_used, var_used = mean, var
        inv_std = 1.0 / np.sqrt(var_used + self.epsilon)
        xhat = (x - mean_used.reshape(shape)) * inv_std.reshape(shape)
        y = (xhat * scale.reshape(shape) + b.reshape(shape)).astype(x.dtype, copy=False)
        ctx.save(xhat=xhat, inv_std=inv_std, scale=scale, shape=shape, axes=axes)
        if not self.training_mode:
            return y
        m = self.momentum
        running_mean = (mean * m + mean_used * (1 - m)).astype(x.dtype, copy=False)
        running_var = (var * m + var_used * (1 - m)).astype(x.dtype, copy=False)
        return y, running_mean, running_var

    def backward(self, ctx, dy, drunning_mean=None, drunning_var=None):
        xhat, inv_std, shape, axes = ctx.xhat, ctx.inv_std, ctx.shape, ctx.axes
        dx = dscale = db = None
        dy = np.zeros_like(xhat) if dy is None else dy
        sum_dy = dy.sum(axis=axes)
        sum_dy_xhat = (dy * xhat).sum(axis=axes)
        if ctx.needs(0):
            k = (ctx.scale * inv_std).reshape(shape)
            if self.training_mode:
                count = xhat.size // xhat.shape[1]
                # Through the batch mean and variance: the usual three-term formula.
                dx = k * (dy - (sum_dy.reshape(shape) + xhat * sum_dy_xhat.reshape(shape))
                          / count)
                w = (1 - self.momentum) / count
                if drunning_mean is not None:
                    dx = dx + (drunning_mean * w).reshape(shape)
                if drunning_var is not None:
                    dx = dx + (2 * drunning_var * w / inv_std).reshape(shape) * xhat
            else:
                dx = dy * k
            dx = dx.astype(xhat.dtype, copy=False)
        if ctx.needs(1):
            dscale = sum_dy_xhat
        if ctx.needs(2):
            db = sum_dy
        return (dx, dscale, db, None, None)
