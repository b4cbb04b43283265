"""HammingWindow: the Hamming window 25/46 - 21/46 cos(2 pi k / N),
of ``size`` points, periodic (default) or symmetric, in ``output_datatype`` (ONNX opset 17+);
no gradient."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from .cast import DTYPES


@register("HammingWindow", since=17)
class HammingWindow(Operator):
    attributes = {"output_datatype": 1, "periodic": 1}
    no_grad_inputs = (0,)

    def forward(self, ctx, size):
        n = int(np.asarray(size).reshape(-1)[0])
        denominator = n if self.periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = 2 * np.pi * k / denominator
            y = 25 / 46 - 21 / 46 * np.cos(a)
        return np.asarray(y).astype(DTYPES[self.output_datatype])

    def backward(self, ctx, dy):
        return (None,)
