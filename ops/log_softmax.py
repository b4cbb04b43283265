"""LogSoftmax: x - log(sum(exp(x))) along an axis (opset 13+), or over a 2-D coercion (1-12)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._softmax import Normalizer, log_softmax


@register("LogSoftmax", since=13)
class LogSoftmax(Normalizer):
    def compute(self, x, axis):
        return log_softmax(x, axis)

    def gradient(self, y, dy, axis):
        return dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)


@register("LogSoftmax", since=1)
class LogSoftmax1(LogSoftmax):
    attributes = {"axis": 1}
    coerce_2d = True
