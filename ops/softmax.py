"""Softmax: exp(x) / sum(exp(x)) along an axis (opset 13+), or over a 2-D coercion (opsets 1-12)."""

from __future__ import annotations

from meta.lv0 import native, register

from ._elementwise import contiguous
from ._softmax import NATIVE_MAX_SIZE, Normalizer, softmax


@register("Softmax", since=13)
class Softmax(Normalizer):
    """ONNX Softmax-13: the operator computes the normalized exponential values for the given
    input."""
    def compute(self, x, axis):
        return softmax(x, axis)

    def gradient(self, y, dy, axis):
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


@register("Softmax", since=1)
class Softmax1(Softmax):
    """ONNX Softmax-1: the operator computes the softmax (normalized exponential) values for
    each layer in the batch of the given input."""
    attributes = {"axis": 1}
    coerce_2d = True


@register("Softmax", since=13, backend="native")
class NativeSoftmax(Softmax):
    """The same operator through cpp/include/meta/softmax.hpp (float32/float64, any axis)."""

    def compute(self, x, axis):
        if not native.supports(x) or x.size > NATIVE_MAX_SIZE:
            return super().compute(x, axis)
        return native.module().softmax_forward(contiguous(x), axis)

    def gradient(self, y, dy, axis):
        if not native.supports(y, dy) or y.size > NATIVE_MAX_SIZE:
            return super().gradient(y, dy, axis)
        return native.module().softmax_backward(y, contiguous(dy), axis)


@register("Softmax", since=1, backend="native")
class NativeSoftmax1(NativeSoftmax):
    """Softmax (opset 1+) on meta's C++ kernel: the numpy operator's semantics, computed
    natively."""
    attributes = {"axis": 1}
    coerce_2d = True
