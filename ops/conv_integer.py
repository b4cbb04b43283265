"""ConvInteger (ONNX opset 10+): the convolution of ``X - x_zero_point`` with
``W - w_zero_point`` (w_zero_point scalar or one per output channel), in int32. Computed by
the float Conv in float64, exact for 8-bit inputs. Not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Context, Operator, register

from .conv import Conv


def integer_conv(attrs: dict, x, w, x_zero_point=None, w_zero_point=None) -> np.ndarray:
    xs = x.astype(np.float64)
    if x_zero_point is not None:
        xs = xs - np.asarray(x_zero_point, np.float64)
    ws = w.astype(np.float64)
    if w_zero_point is not None:
        zp = np.asarray(w_zero_point, np.float64)
        ws = ws - (zp.reshape(-1, *(1,) * (w.ndim - 1)) if zp.size > 1 else zp.reshape(()))
    (y,) = Conv(**attrs).apply(Context(), xs, ws)
    return np.rint(y).astype(np.int32)


@register("ConvInteger", since=10)
class ConvInteger(Operator):
    """ONNX ConvInteger-10: the integer convolution operator consumes an input tensor, its
    zero-point, a filter, and its zero-point, and computes the output."""
    attributes = dict(Conv.attributes)
    no_grad_inputs = (0, 1, 2, 3)

    def forward(self, ctx, x, w, x_zero_point=None, w_zero_point=None):
        return integer_conv(self.attrs, x, w, x_zero_point, w_zero_point)

    def backward(self, ctx, dy):
        return (None, None, None, None)
