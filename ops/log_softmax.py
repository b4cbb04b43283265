"""LogSoftmax: x - log(sum(exp(x))) along an axis (opset 13+), or over a 2-D coercion (1-12)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import native, register

from ._elementwise import contiguous
from ._softmax import NATIVE_MAX_SIZE, Normalizer, log_softmax


@register("LogSoftmax", since=13)
class LogSoftmax(Normalizer):
    """ONNX LogSoftmax-13: the operator computes the log of softmax values for the given input."""
    def compute(self, x, axis):
        return log_softmax(x, axis)

    def gradient(self, y, dy, axis):
        return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)


@register("LogSoftmax", since=1)
class LogSoftmax1(LogSoftmax):
    """ONNX LogSoftmax-1: the operator computes the logsoftmax (log of softmax) values for each
    layer in the batch of the given input."""
    attributes = {"axis": 1}
    coerce_2d = True


@register("LogSoftmax", since=13, backend="native")
class NativeLogSoftmax(LogSoftmax):
    """The same operator through cpp/include/meta/softmax.hpp (float32/float64, any axis)."""

    def compute(self, x, axis):
        if not native.supports(x) or x.size > NATIVE_MAX_SIZE:
            return super().compute(x, axis)
        return native.module().log_softmax_forward(contiguous(x), axis)

    def gradient(self, y, dy, axis):
        if not native.supports(y, dy) or y.size > NATIVE_MAX_SIZE:
            return super().gradient(y, dy, axis)
        return native.module().log_softmax_backward(y, contiguous(dy), axis)


@register("LogSoftmax", since=1, backend="native")
class NativeLogSoftmax1(NativeLogSoftmax):
    """LogSoftmax (opset 1+) on meta's C++ kernel: the numpy operator's semantics, computed
    natively."""
    attributes = {"axis": 1}
    coerce_2d = True
