"""QLinearConv (ONNX opset 10+): a convolution of quantized tensors, requantized:
``saturate(round((conv(X - x_zp, W - w_zp) + B) * x_scale * w_scale / y_scale) + y_zp)``
(w_scale and w_zp scalar or one per output channel; B int32). Not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._quantize import saturate
from .conv import Conv
from .conv_integer import integer_conv


@register("QLinearConv", since=10)
class QLinearConv(Operator):
    """ONNX QLinearConv-10: the convolution operator consumes a quantized input tensor, its
    scale and zero point, a quantized filter, its scale and zero point, and output's scale and
    zero point, and computes the quantized output."""
    attributes = dict(Conv.attributes)
    no_grad_inputs = tuple(range(9))

    def forward(self, ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
                y_zero_point, b=None):
        acc = integer_conv(self.attrs, x, w, x_zero_point, w_zero_point)
        if b is not None:
            acc = acc + b.astype(np.int32).reshape(-1, *(1,) * (x.ndim - 2))
        w_scale = np.asarray(w_scale)
        if w_scale.size > 1:
            w_scale = w_scale.reshape(-1, *(1,) * (x.ndim - 2))
        y = acc * (x_scale * w_scale / y_scale)
        if y_zero_point is not None:
            y = y + y_zero_point
        return saturate(y, x.dtype if y_zero_point is None else y_zero_point.dtype)

    def backward(self, ctx, dy):
        return (None,) * 9
