"""ReverseSequence: each batch entry's first ``sequence_lens[b]`` time steps reversed, the
rest kept (ONNX opset 10+). Its own inverse, so the gradient is the same op on dy."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("ReverseSequence", since=10)
class ReverseSequence(Operator):
    """ONNX ReverseSequence-10: reverse batch of sequences having different lengths specified by
    sequence_lens."""
    attributes = {"batch_axis": 1, "time_axis": 0}
    no_grad_inputs = (1,)

    def _reverse(self, x, lens):
        t_ax, b_ax = self.time_axis % x.ndim, self.batch_axis % x.ndim
        y = x.copy()
        for b, n in enumerate(np.asarray(lens).reshape(-1)):
            src = [slice(None)] * x.ndim
            src[b_ax] = b
            src[t_ax] = slice(None, int(n))
            dst = list(src)
            dst[t_ax] = slice(int(n) - 1, None, -1) if n > 0 else slice(0, 0)
            y[tuple(src)] = x[tuple(dst)]
        return y

    def forward(self, ctx, x, sequence_lens):
        ctx.save(lens=sequence_lens)
        return self._reverse(x, sequence_lens)

    def backward(self, ctx, dy):
        return (None if dy is None else self._reverse(dy, ctx.lens), None)
