"""BatchNormalization (ONNX opset 14+, ``training_mode``; 15 only widened the types; opsets
6-13 are registered below).

Inputs X (N, C, ...), scale, B, input_mean, input_var (C). Inference normalises with the given
statistics. ``training_mode=1`` normalises with the batch mean and (biased) variance, backprops
through them, and also outputs ``running_mean = input_mean * momentum + mean * (1 - momentum)``
and the same for the variance, as the spec says (their gradient into X is correct, should
anything consume them).

The executor's mode overrides ``training_mode`` (``ctx.mode``): a network exported for
inference trains with batch statistics, one exported in training form evaluates with the
stored ones. ``input_mean``/``input_var`` are *state*: not learned (no gradient), but updated
in place by the executor after each training-mode forward, through ``update_state``. That update
follows PyTorch (and cuDNN): the running variance takes the *unbiased* batch variance
(n / (n - 1)), so a network trained here keeps the statistics it would have in PyTorch; the
spec's functional outputs above keep the biased one, as onnx.reference computes them.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, native, register

from ._elementwise import contiguous


@register("BatchNormalization", since=14)
class BatchNormalization(Operator):
    """ONNX BatchNormalization-14: carries out batch normalization as described in the paper
    https://arxiv.org/abs/1502.03167."""
    learnable_inputs = (1, 2)  # scale and bias
    attributes = {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0}
    no_grad_inputs = (3, 4)
    state_inputs = (3, 4)

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return {k: v for k, v in attrs.items() if k != "training_mode"}, inputs, outputs[:1]

    def update_state(self, ctx, mean, var):
        if getattr(ctx, "batch_mean", None) is None:
            return None  # the forward ran in inference mode
        n = ctx.count
        unbiased = ctx.batch_var * (n / (n - 1)) if n > 1 else ctx.batch_var
        return self.running(mean, var, ctx.batch_mean, unbiased, mean.dtype)

    def results(self, ctx, y, mean, var, mean_used, var_used, training):
        """y, plus what the node's other outputs hold: the spec's running statistics in
        training, the given ones when the executor's eval mode runs a training-form node."""
        if training:
            ctx.save(batch_mean=mean_used, batch_var=var_used, count=y.size // y.shape[1])
            return (y, *self.running(mean, var, mean_used, var_used, y.dtype))
        return (y, mean, var) if self.training_mode else y

    def check(self, x, scale, b, mean, var) -> None:
        c = x.shape[1] if x.ndim >= 2 else None
        for name, v in (("scale", scale), ("B", b), ("input_mean", mean), ("input_var", var)):
            if v.shape != (c,):
                raise ValueError(f"BatchNormalization: {name} {list(v.shape)} must be ({c},) "
                                 f"for X {list(x.shape)} (one value per channel)")

    def running(self, mean, var, mean_used, var_used, dtype):
        """The running statistics output in training mode."""
        m = self.momentum
        running_mean = (mean * m + mean_used * (1 - m)).astype(dtype, copy=False)
        running_var = (var * m + var_used * (1 - m)).astype(dtype, copy=False)
        return running_mean, running_var

    def forward(self, ctx, x, scale, b, mean, var):
        self.check(x, scale, b, mean, var)
        c = x.shape[1]
        axes = (0, *range(2, x.ndim))
        shape = (c, *(1,) * (x.ndim - 2))
        training = ctx.mode(bool(self.training_mode))
        if training:  # summed in double, as PyTorch's CPU kernel and the native twin do
            mean_used = x.mean(axis=axes, dtype=np.float64).astype(x.dtype, copy=False)
            var_used = x.var(axis=axes, dtype=np.float64).astype(x.dtype, copy=False)
        else:
            mean_used, var_used = mean, var
        inv_std = 1.0 / np.sqrt(var_used + self.epsilon)
        xhat = (x - mean_used.reshape(shape)) * inv_std.reshape(shape)
        y = (xhat * scale.reshape(shape) + b.reshape(shape)).astype(x.dtype, copy=False)
        ctx.save(xhat=xhat, inv_std=inv_std, scale=scale, shape=shape, axes=axes,
                 training=training)
        return self.results(ctx, y, mean, var, mean_used, var_used, training)

    def backward(self, ctx, dy, drunning_mean=None, drunning_var=None):
        xhat, inv_std, shape, axes = ctx.xhat, ctx.inv_std, ctx.shape, ctx.axes
        dx = dscale = db = None
        dy = np.zeros_like(xhat) if dy is None else dy
        # the per-channel sums in double (as the statistics), then in the tensors' dtype
        dtype = np.result_type(dy, xhat)
        sum_dy = dy.sum(axis=axes, dtype=np.float64).astype(dtype, copy=False)
        sum_dy_xhat = (dy * xhat).sum(axis=axes, dtype=np.float64).astype(dtype, copy=False)
        if ctx.needs(0):
            k = (ctx.scale * inv_std).reshape(shape)
            if ctx.training:
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


@register("BatchNormalization", since=14, backend="native")
class NativeBatchNormalization(BatchNormalization):
    """The same operator through cpp/include/meta/batchnorm.hpp: forward is a statistics pass
    (training only) and a normalising pass; backward a sums pass and a dx pass. Saves X itself
    rather than the normalised X (the same size, but forward writes one tensor fewer)."""

    def forward(self, ctx, x, scale, b, mean, var):
        if not (native.supports(x, scale, b, mean, var) and x.ndim >= 2 and x.size):
            return super().forward(ctx, x, scale, b, mean, var)
        self.check(x, scale, b, mean, var)
        x = contiguous(x)
        scale = contiguous(scale)
        training = ctx.mode(bool(self.training_mode))
        y, mean_used, var_used, inv_std = native.module().batchnorm_forward(
            x, scale, contiguous(b), contiguous(mean), contiguous(var),
            epsilon=float(self.epsilon), training=training)
        ctx.save(native=True, x=x, mean_used=mean_used, inv_std=inv_std, scale=scale,
                 training=training)
        return self.results(ctx, y, mean, var, mean_used, var_used, training)

    def backward(self, ctx, dy, drunning_mean=None, drunning_var=None):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dy, drunning_mean, drunning_var)
        x, inv_std = ctx.x, ctx.inv_std
        dy = np.zeros_like(x) if dy is None else np.ascontiguousarray(dy, dtype=x.dtype)
        em = ev = None
        if ctx.training and ctx.needs(0) and (drunning_mean is not None
                                                     or drunning_var is not None):
            # The running statistics' share of dx: em + ev * xhat per channel, as numpy's.
            w = (1 - self.momentum) / (x.size // x.shape[1])
            zero = np.zeros_like(inv_std)
            em = zero if drunning_mean is None else (drunning_mean * w).astype(x.dtype)
            ev = zero if drunning_var is None else (2 * drunning_var * w / inv_std).astype(
                x.dtype)
        dx, sum_dy, sum_dy_xhat = native.module().batchnorm_backward(
            x, dy, ctx.mean_used, inv_std, ctx.scale, training=ctx.training,
            need_dx=ctx.needs(0), em=em, ev=ev)
        return (dx, sum_dy_xhat if ctx.needs(1) else None, sum_dy if ctx.needs(2) else None,
                None, None)


# -- opsets 6-13 ------------------------------------------------------------------------------
class _LegacyBatchNormalization:
    """Opsets 6-13 (mix in before the opset-14 class): no ``training_mode``; exporters list up
    to five outputs, Y, running mean, running variance, and the batch mean and variance used
    ("saved"). As written the node runs for inference (the executor's ``train()`` makes it
    train, updating its state as opset 14 does). The outputs a node lists are all produced: in
    training the spec's values, in inference the given statistics. ``spatial=0`` (opsets 6-8)
    keeps statistics per element of X's non-batch dimensions instead of per channel: scale,
    B, mean and var have X's shape without N, and the batch axis is the only one reduced."""

    attributes = {"epsilon": 1e-5, "momentum": 0.9}
    training_mode = 0
    n_outputs = 1  # set from the node by make_operator

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return attrs, inputs, outputs[:1]

    def results(self, ctx, y, mean, var, mean_used, var_used, training):
        if training:
            out = super().results(ctx, y, mean, var, mean_used, var_used, training)
            out = (*out, mean_used.astype(y.dtype, copy=False),
                   var_used.astype(y.dtype, copy=False))
        else:
            out = (y, mean, var, mean, var)
        return out[:max(self.n_outputs, 1)]

    def per_element(self, x) -> bool:
        return not getattr(self, "spatial", 1) and x.ndim > 2

    def forward(self, ctx, x, scale, b, mean, var):
        if not self.per_element(x):
            return super().forward(ctx, x, scale, b, mean, var)
        # Each element of X[n] is a channel of its own: X as (N, C * D1 * ...), params flat.
        for name, v in (("scale", scale), ("B", b), ("input_mean", mean), ("input_var", var)):
            if v.shape != x.shape[1:]:
                raise ValueError(f"BatchNormalization: {name} {list(v.shape)} must be "
                                 f"{list(x.shape[1:])} for X {list(x.shape)} with spatial=0")
        flat = [v.reshape(-1) for v in (scale, b, mean, var)]
        out = super().forward(ctx, x.reshape(len(x), -1), *flat)
        ctx.save(element_shape=x.shape)
        out = out if isinstance(out, tuple) else (out,)
        return tuple(v.reshape(x.shape if i == 0 else x.shape[1:]) for i, v in enumerate(out))

    def update_state(self, ctx, mean, var):
        new = super().update_state(ctx, mean.reshape(-1), var.reshape(-1))
        return None if new is None else tuple(v.reshape(mean.shape) for v in new)

    def backward(self, ctx, dy, drunning_mean=None, drunning_var=None, dsaved_mean=None,
                 dsaved_var=None):
        shape = getattr(ctx, "element_shape", None)
        if shape is not None:
            flat = [None if g is None else g.reshape(len(g), -1) if i == 0 else g.reshape(-1)
                    for i, g in enumerate((dy, drunning_mean, drunning_var, dsaved_mean,
                                           dsaved_var))]
            grads = self.backward_flat(ctx, *flat)
            return tuple(None if g is None else g.reshape(shape if i == 0 else shape[1:])
                         for i, g in enumerate(grads))
        return self.backward_flat(ctx, dy, drunning_mean, drunning_var, dsaved_mean, dsaved_var)

    def backward_flat(self, ctx, dy, drunning_mean, drunning_var, dsaved_mean, dsaved_var):
        grads = list(super().backward(ctx, dy, drunning_mean, drunning_var))
        if ctx.training and ctx.needs(0) and (dsaved_mean is not None or dsaved_var is not None):
            # The batch statistics as outputs: d mean / dx = 1 / n, d var / dx = 2 (x - mean) / n.
            x_hat = ctx.xhat if hasattr(ctx, "xhat") else \
                (ctx.x - ctx.mean_used.reshape(-1, *(1,) * (ctx.x.ndim - 2))) \
                * ctx.inv_std.reshape(-1, *(1,) * (ctx.x.ndim - 2))
            shape = (-1, *(1,) * (x_hat.ndim - 2))
            count = x_hat.size // x_hat.shape[1]
            extra = 0.0
            if dsaved_mean is not None:
                extra = extra + (dsaved_mean / count).reshape(shape)
            if dsaved_var is not None:
                extra = extra + (2 * dsaved_var / (count * ctx.inv_std)).reshape(shape) * x_hat
            grads[0] = (grads[0] + extra).astype(x_hat.dtype, copy=False)
        return tuple(grads)


class _BatchNormalization6:
    """Opset 6: ``is_test`` (default 0: the node trains as written), ``spatial``; the
    ``consumed_inputs`` of opset 1 is accepted and ignored."""

    attributes = {"epsilon": 1e-5, "momentum": 0.9, "is_test": 0, "spatial": 1,
                  "consumed_inputs": None}

    @property
    def training_mode(self) -> int:
        return int(not self.is_test)

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return {**attrs, "is_test": 1}, inputs, outputs[:1]


@register("BatchNormalization", since=9)
class BatchNormalization9(_LegacyBatchNormalization, BatchNormalization):
    """Opsets 9-13: opset 14 without ``training_mode``."""


@register("BatchNormalization", since=7)
class BatchNormalization7(_LegacyBatchNormalization, BatchNormalization):
    """Opsets 7-8: opset 9 plus ``spatial``."""

    attributes = {"epsilon": 1e-5, "momentum": 0.9, "spatial": 1}


@register("BatchNormalization", since=6)
class BatchNormalization6(_BatchNormalization6, _LegacyBatchNormalization, BatchNormalization):
    """Opset 6: opset 7 plus ``is_test``."""


@register("BatchNormalization", since=9, backend="native")
class NativeBatchNormalization9(_LegacyBatchNormalization, NativeBatchNormalization):
    """BatchNormalization (opset 9+) on meta's C++ kernel: the numpy operator's semantics,
    computed natively."""
    pass


@register("BatchNormalization", since=7, backend="native")
class NativeBatchNormalization7(_LegacyBatchNormalization, NativeBatchNormalization):
    """BatchNormalization (opset 7+) on meta's C++ kernel: the numpy operator's semantics,
    computed natively."""
    attributes = BatchNormalization7.attributes


@register("BatchNormalization", since=6, backend="native")
class NativeBatchNormalization6(_BatchNormalization6, _LegacyBatchNormalization,
                                NativeBatchNormalization):
    """BatchNormalization (opset 6+) on meta's C++ kernel: the numpy operator's semantics,
    computed natively."""
    pass
