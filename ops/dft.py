"""DFT (ONNX opsets 17, 20+): the discrete Fourier transform along one axis.

X is (..., 1) real or (..., 2) complex (real, imaginary); the transform runs along ``axis``
(an attribute at 17, default 1; an input from 20, default -2) with ``dft_length`` points (X is
zero-padded or truncated; default its length, or ``2 (n - 1)`` for a one-sided inverse).
``onesided`` keeps the first ``n // 2 + 1`` frequencies; ``inverse`` runs the inverse
transform (scaled by 1/n), whose one-sided form takes those frequencies and gives a real
signal (..., 1). The output is (..., 2) otherwise.

Backward w.r.t. X: every form is linear, so its adjoint, through numpy's FFTs (the transform
with conjugate twiddles; for the one-sided inverse, the forward real transform with the
doubled bins weighted twice and the imaginary parts of the DC and Nyquist bins dropped).
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _fit(z: np.ndarray, length: int, axis: int) -> np.ndarray:
    """z zero-padded or truncated to ``length`` along ``axis``."""
    have = z.shape[axis]
    if have >= length:
        return np.take(z, np.arange(length), axis=axis)
    pad = [(0, 0)] * z.ndim
    pad[axis] = (0, length - have)
    return np.pad(z, pad)


def _pairs(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1)


@register("DFT", since=20)
class DFT(Operator):
    """ONNX DFT-20: computes the discrete Fourier Transform (DFT) of the input."""
    attributes = {"inverse": 0, "onesided": 0}
    no_grad_inputs = (1, 2)

    def forward(self, ctx, x, dft_length=None, axis=None):
        return self.transform(ctx, x, dft_length, -2 if axis is None else int(np.reshape(
            axis, -1)[0]))

    def transform(self, ctx, x, dft_length, axis):
        if x.shape[-1] not in (1, 2):
            raise ValueError(f"DFT: the last axis of X {list(x.shape)} must be 1 (real) or 2 "
                             f"(complex)")
        axis = axis % x.ndim
        if axis == x.ndim - 1:
            raise ValueError("DFT: axis is the real/imaginary axis")
        length = x.shape[axis]
        if dft_length is not None and np.size(dft_length):
            n = int(np.reshape(dft_length, -1)[0])
        else:
            n = 2 * (length - 1) if self.inverse and self.onesided else length
        z = _complex(x)
        if not self.inverse:
            y = np.fft.fft(z, n=n, axis=axis)
            if self.onesided:
                y = np.take(y, np.arange(n // 2 + 1), axis=axis)
            out = _pairs(y)
        elif self.onesided:
            out = np.fft.irfft(z, n=n, axis=axis)[..., None]
        else:
            out = _pairs(np.fft.ifft(z, n=n, axis=axis))
        ctx.save(n=n, axis=axis, length=length, real=x.shape[-1] == 1)
        return out.astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        n, axis, length = ctx.n, ctx.axis, ctx.length
        if not self.inverse:
            g = _complex(dy)
            g = _fit(g, n, axis) if self.onesided else g  # the dropped frequencies get 0
            g = np.fft.ifft(g, axis=axis) * n  # the conjugate-twiddle transform
        elif self.onesided:
            half = n // 2 + 1
            g = np.fft.rfft(dy[..., 0], n=n, axis=axis) / n
            weight = np.full(half, 2.0)
            weight[0] = 1.0
            if n % 2 == 0:
                weight[-1] = 1.0
            shape = [1] * g.ndim
            shape[axis] = half
            g = g * weight.reshape(shape)
            imag_kept = np.ones(half)
            imag_kept[0] = 0.0
            if n % 2 == 0:
                imag_kept[-1] = 0.0
            g = g.real + 1j * g.imag * imag_kept.reshape(shape)
        else:
            g = np.fft.fft(_complex(dy), axis=axis) / n
        g = _fit(g, length, axis)
        dx = g.real[..., None] if ctx.real else _pairs(g)
        return (dx.astype(dy.dtype, copy=False), None, None)


@register("DFT", since=17)
class DFT17(DFT):
    """Opset 17: ``axis`` is an attribute (default 1)."""

    attributes = {"axis": 1, "inverse": 0, "onesided": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, dft_length=None):
        return self.transform(ctx, x, dft_length, self.axis)

    def backward(self, ctx, dy):
        return super().backward(ctx, dy)[:2]
