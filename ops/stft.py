"""STFT (ONNX opset 17+): the short-time Fourier transform.

signal (B, L, 1) real or (B, L, 2) complex; frames of ``frame_length`` (default: the
window's length, else L) every ``frame_step`` samples, ``1 + (L - frame_length) //
frame_step`` of them, each multiplied by ``window`` (default ones) and transformed with
``frame_length`` points; ``onesided`` (default 1) keeps ``frame_length // 2 + 1``
frequencies. Output (B, frames, frequencies, 2).

Backward w.r.t. the signal (the frames' adjoint transforms, windowed, added back where the
frames overlap) and the window.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from .dft import _complex, _fit, _pairs


@register("STFT", since=17)
class STFT(Operator):
    """ONNX STFT-17: computes the Short-time Fourier Transform of the signal."""
    attributes = {"onesided": 1}
    no_grad_inputs = (1, 3)

    def forward(self, ctx, signal, frame_step, window=None, frame_length=None):
        step = int(np.reshape(frame_step, -1)[0])
        if frame_length is not None and np.size(frame_length):
            n = int(np.reshape(frame_length, -1)[0])
        else:
            n = signal.shape[1] if window is None else window.shape[0]
        w = np.ones(n, signal.dtype) if window is None else window
        if w.shape != (n,):
            raise ValueError(f"STFT: window {list(w.shape)} must be ({n},), the frame length")
        z = _complex(signal)  # (B, L)
        count = 1 + (z.shape[1] - n) // step
        if count < 1:
            raise ValueError(f"STFT: frame_length {n} is longer than the signal "
                             f"{signal.shape[1]}")
        index = np.arange(count)[:, None] * step + np.arange(n)[None, :]  # (frames, n)
        frames = z[:, index]  # (B, frames, n)
        spectrum = np.fft.fft(frames * w, axis=-1)
        if self.onesided:
            spectrum = spectrum[..., :n // 2 + 1]
        ctx.save(frames=frames, window=w, index=index, n=n, shape=signal.shape,
                 real=signal.shape[-1] == 1, given_window=window is not None)
        return _pairs(spectrum).astype(signal.dtype, copy=False)

    def backward(self, ctx, dy):
        n, w = ctx.n, ctx.window
        g = _complex(dy)
        if self.onesided:
            g = _fit(g, n, -1)
        dwindowed = np.fft.ifft(g, axis=-1) * n  # adjoint of the transform, (B, frames, n)
        dframes = dwindowed * w
        dz = np.zeros((ctx.shape[0], ctx.shape[1]), complex)
        np.add.at(dz, (slice(None), ctx.index), dframes)
        dsignal = dz.real[..., None] if ctx.real else _pairs(dz)
        dw = None
        if ctx.given_window:  # w is real: the real part of the conjugate pairing
            dw = (np.conj(ctx.frames) * dwindowed).real.sum(axis=(0, 1))
        return (dsignal.astype(dy.dtype, copy=False), None,
                None if dw is None else dw.astype(w.dtype, copy=False), None)
