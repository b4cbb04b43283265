"""Unique, MatMulInteger and DequantizeLinear where onnx.reference cannot be the oracle, and
the quantization round trip."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Context
from meta.ops.dequantize_linear import DequantizeLinear
from meta.ops.mat_mul_integer import MatMulInteger
from meta.ops.quantize_linear import QuantizeLinear
from meta.ops.unique import Unique


def test_unsorted_unique_of_a_matrix_keeps_first_occurrence_order():
    x = np.array([[3, 1], [3, 2]])
    y, first, inverse, counts = Unique(sorted=0).apply(Context(), x)
    np.testing.assert_array_equal(y, [3, 1, 2])
    np.testing.assert_array_equal(first, [0, 1, 3])
    np.testing.assert_array_equal(inverse, [0, 1, 0, 2])
    np.testing.assert_array_equal(counts, [2, 1, 1])
    y, *_ = Unique(sorted=0, axis=1).apply(Context(), np.array([[2, 1, 2], [0, 5, 0]]))
    np.testing.assert_array_equal(y, [[2, 1], [0, 5]])


def test_matmul_integer_per_row_zero_point():
    a = np.array([[10, 20], [30, 40]], np.uint8)
    b = np.array([[1, 2], [3, 4]], np.uint8)
    (y,) = MatMulInteger().apply(Context(), a, b, np.array([10, 30], np.uint8),
                                 np.array([1, 2], np.uint8))
    np.testing.assert_array_equal(y, (np.array([[0, 10], [0, 10]]) @ np.array([[0, 0],
                                                                                [2, 2]])))
    assert y.dtype == np.int32


def test_quantize_dequantize_round_trip_and_scale_gradient():
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    scale = np.array([0.01, 0.02, 0.04])
    zero = np.array([0, 3, -3], np.int8)
    (q,) = QuantizeLinear(axis=0).apply(Context(), x, scale, zero)
    assert q.dtype == np.int8
    ctx = Context()
    (back,) = DequantizeLinear(axis=0).apply(ctx, q, scale, zero)
    np.testing.assert_allclose(back, x, atol=scale.max() / 2 + 1e-12)
    _, dscale, _ = DequantizeLinear(axis=0).backward(ctx, np.ones_like(back))
    np.testing.assert_allclose(dscale, (q.astype(float) - zero[:, None]).sum(axis=1))
