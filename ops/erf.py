"""Erf: the error function (ONNX opset 9+), to full float64 precision (ops._special);
dy/dx = 2/sqrt(pi) e^(-x^2)."""

from __future__ import annotations

from meta.lv0 import register

from . import _special
from ._elementwise import Unary


@register("Erf", since=9)
class Erf(Unary):
    """ONNX Erf-9: computes the error function of the given input tensor element-wise."""
    keep = ("x",)

    def function(self, x):
        return _special.erf(x)

    def derivative(self, x, y):
        return _special.erf_derivative(x)
