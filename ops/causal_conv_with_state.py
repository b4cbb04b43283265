"""CausalConvWithState (ONNX opset 27+): a depthwise causal 1-D convolution that carries its
state across calls, then optionally SiLU.

input (B, C, L), weight (C, 1, k), optional bias (C) and past_state (B, C, k-1, default
zeros): the past is prepended, each channel convolved with its own kernel (no padding, so the
output is (B, C, L)), and the last k-1 columns of [past, input] come out as present_state.
``activation`` "silu" (or "swish") applies ``x * sigmoid(x)``.

Backward w.r.t. input, weight, bias and past_state, through both outputs.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from meta.lv0 import Operator, register


@register("CausalConvWithState", since=27)
class CausalConvWithState(Operator):
    """ONNX CausalConvWithState-27: stateful causal 1D depthwise convolution."""
    attributes = {"activation": "none"}

    def forward(self, ctx, x, weight, bias=None, past_state=None):
        if self.activation not in ("none", "silu", "swish"):
            raise ValueError(f"CausalConvWithState: unknown activation {self.activation!r}")
        if x.ndim != 3 or weight.ndim != 3 or weight.shape[:2] != (x.shape[1], 1):
            raise ValueError(f"CausalConvWithState: input {list(x.shape)} must be (B, C, L) "
                             f"and weight {list(weight.shape)} (C, 1, k)")
        b, c, length = x.shape
        k = weight.shape[2]
        past = np.zeros((b, c, k - 1), x.dtype) if past_state is None else past_state
        padded = np.concatenate([past, x], axis=2)
        windows = sliding_window_view(padded, k, axis=2)  # (B, C, L, k)
        z = np.einsum("bctj,cj->bct", windows, weight[:, 0, :])
        if bias is not None:
            z = z + bias[None, :, None]
        z = z.astype(x.dtype, copy=False)
        y = z
        if self.activation != "none":
            s = 1 / (1 + np.exp(-z))
            y = (z * s).astype(x.dtype, copy=False)
            ctx.save(z=z, s=s)
        ctx.save(windows=windows, weight=weight, k=k, length=length,
                 past_given=past_state is not None, has_bias=bias is not None)
        return y, padded[:, :, padded.shape[2] - (k - 1):]

    def backward(self, ctx, dy, dstate=None):
        k, length, weight = ctx.k, ctx.length, ctx.weight
        windows = ctx.windows
        b, c = windows.shape[:2]
        dz = np.zeros((b, c, length), weight.dtype) if dy is None else dy
        if self.activation != "none" and dy is not None:
            s = ctx.s
            dz = dy * (s + ctx.z * s * (1 - s))
        dw = np.einsum("bct,bctj->cj", dz, windows)[:, None, :]
        dpadded = np.zeros((b, c, length + k - 1), dz.dtype)
        for j in range(k):  # the adjoint of the sliding windows
            dpadded[:, :, j:j + length] += dz * weight[None, :, 0, j, None]
        if dstate is not None and k > 1:
            dpadded[:, :, length:] += dstate
        dbias = dz.sum(axis=(0, 2)) if ctx.has_bias else None
        dpast = dpadded[:, :, :k - 1] if ctx.past_given else None
        return (dpadded[:, :, k - 1:], dw.astype(weight.dtype, copy=False), dbias, dpast)
