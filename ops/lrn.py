"""LRN (ONNX opset 1+; 13 only widened the types): local response normalisation over channels.

``y = x / (bias + alpha / size * S) ** beta`` where S sums x**2 over the channels
``[c - floor((size-1)/2), c + ceil((size-1)/2)]`` (clipped to the tensor), as in AlexNet.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def channel_window_sum(a: np.ndarray, before: int, after: int) -> np.ndarray:
    """For each channel c, the sum of ``a`` over channels [c - before, c + after] (clipped),
    from one cumulative sum rather than ``size`` shifted adds."""
    c = a.shape[1]
    cum = np.cumsum(a, axis=1)
    zero = np.zeros_like(cum[:, :1])
    cum = np.concatenate([zero, cum], axis=1)  # cum[:, j] = sum of channels < j
    hi = np.minimum(np.arange(c) + after + 1, c)
    lo = np.maximum(np.arange(c) - before, 0)
    return cum[:, hi] - cum[:, lo]


@register("LRN", since=1)
class LRN(Operator):
    """ONNX LRN-1: local Response Normalization proposed in the AlexNet paper."""
    attributes = {"alpha": 0.0001, "beta": 0.75, "bias": 1.0, "size": None}

    def span(self) -> tuple[int, int]:
        return (self.size - 1) // 2, self.size // 2  # floor and ceil of (size - 1) / 2

    def forward(self, ctx, x):
        if self.size is None or self.size < 1:
            raise ValueError(f"LRN: the size attribute must be a positive int, got {self.size}")
        if x.ndim < 3:
            raise ValueError(f"LRN: X {list(x.shape)} must be (N, C, d1, ...)")
        before, after = self.span()
        s = self.bias + self.alpha / self.size * channel_window_sum(x * x, before, after)
        y = x * s ** -self.beta
        ctx.save(x=x, s=s, y=y)
        return y.astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        x, s, y = ctx.x, ctx.s, ctx.y
        before, after = self.span()
        # Channel j appears in the window of c for c in [j - after, j + before]: the transpose.
        t = channel_window_sum(dy * y / s, after, before)
        dx = dy * s ** -self.beta - 2 * self.beta * self.alpha / self.size * x * t
        return (dx.astype(x.dtype, copy=False),)
