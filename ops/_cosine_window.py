"""The generalized cosine windows of ONNX opset 17 (Hann, Hamming, Blackman):
w[k] = sum_j (-1)^j a_j cos(2 pi j k / N), N = size (periodic, the default) or size - 1
(symmetric), in ``output_datatype``; the size is an integer input, so no gradient."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from meta.lv0 import Operator

from .cast import DTYPES


class CosineWindow(Operator):
    attributes = {"output_datatype": 1, "periodic": 1}
    no_grad_inputs = (0,)
    coefficients: ClassVar[tuple[float, ...]] = ()  # a_0, a_1, ...

    def forward(self, ctx, size):
        n = int(np.asarray(size).reshape(-1)[0])
        denominator = n if self.periodic else n - 1
        k = np.arange(n, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = 2 * np.pi * k / denominator
            y = sum((-1) ** j * c * np.cos(j * a) for j, c in enumerate(self.coefficients))
        return np.asarray(y).astype(DTYPES[self.output_datatype])

    def backward(self, ctx, dy):
        return (None,)
