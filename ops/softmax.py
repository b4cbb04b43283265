"""Softmax: exp(x) / sum(exp(x)) along an axis (opset 13+), or over a 2-D coercion (opsets 1-12)."""

from __future__ import annotations

from meta.lv0 import register

from ._softmax import Normalizer, softmax


@register("Softmax", since=13)
class Softmax(Normalizer):
    def compute(self, x, axis):
        return softmax(x, axis)

    def gradient(self, y, dy, axis):
        return y * (dy - (dy * y).sum(axis=axis, keepdims=True))


@register("Softmax", since=1)
class Softmax1(Softmax):
    attributes = {"axis": 1}
    coerce_2d = True
