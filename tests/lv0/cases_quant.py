"""Test cases for pooling extras, Unique, NonMaxSuppression and the quantization operators
(see cases.py)."""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto

from .cases import _away_from_zero
from .cases_nn import OracleLimit


def lp_pool(rng):
    x = _away_from_zero(rng, (1, 2, 5, 5))
    return [({"kernel_shape": [2, 2]}, [x]),
            ({"kernel_shape": [3, 3], "p": 1, "strides": [2, 2], "pads": [1, 1, 1, 1]}, [x]),
            ({"kernel_shape": [2, 2], "p": 3, "auto_pad": "SAME_UPPER"}, [x]),
            ({"kernel_shape": [2, 2], "dilations": [2, 2]}, [x], range(18, 100)),
            ({"kernel_shape": [3]}, [_away_from_zero(rng, (2, 3, 6))])]


def max_unpool(rng):
    x = rng.standard_normal((1, 2, 2, 2))
    # MaxPool(kernel 2, stride 2) indices into a (1, 2, 4, 4) tensor
    indices = np.array([[[[5, 7], [13, 15]], [[16, 19], [24, 30]]]], np.int64)
    return [({"kernel_shape": [2, 2], "strides": [2, 2]}, [x, indices]),
            ({"kernel_shape": [2, 2], "strides": [2, 2]},
             [x, indices, np.array([1, 2, 5, 5], np.int64)])]


def unique(rng):
    ints = rng.integers(0, 4, (3, 4))
    floats = np.array([2.0, 1.0, 1.0, 3.0, 4.0, 3.0])
    rows = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [0, 1, 1]], np.int64)
    # onnx.reference takes the unsorted values along axis 0 of the unflattened X: wrong for an
    # N-D X without axis (tests/lv0/test_quant_ops.py checks that case)
    flat_bug = "onnx.reference does not flatten X for sorted=0 without axis"
    return [({}, [floats]), ({"sorted": 0}, [floats]), ({}, [ints]),
            (OracleLimit({"sorted": 0}, 0, flat_bug), [ints]),
            ({"axis": 0}, [rows]), ({"axis": -1}, [rows.T.copy()]),
            ({"axis": 0, "sorted": 0}, [rows])]


def quantize_linear(rng):
    x = rng.uniform(-20, 20, (2, 3, 4))
    scale1 = np.array([0.5, 0.25, 2.0])
    blocks = rng.uniform(0.1, 1.0, (2, 3, 2))
    return [({}, [x, np.array(0.2)]),
            ({}, [x, np.array(0.2), np.array(10, np.uint8)]),
            ({}, [x, np.array(0.3), np.array(-3, np.int8)]),
            ({"axis": 1}, [x, scale1, np.array([0, 5, -5], np.int8)]),
            ({"axis": -2}, [x, scale1, np.array([0, 1, 128], np.uint8)]),
            ({"axis": 2, "block_size": 2}, [x, blocks], range(21, 100)),
            ({"output_dtype": TensorProto.INT16}, [x * 1000, np.array(0.01)], range(21, 100)),
            ({}, [x, np.array(0.001), np.array(100, np.uint16)]),
            ({"precision": TensorProto.FLOAT}, [x, np.array(0.2)], range(23, 100))]


def dequantize_linear(rng):
    q = rng.integers(0, 255, (2, 3, 4)).astype(np.uint8)
    s = rng.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    return [({}, [q, np.array(0.5)]),
            ({}, [q, np.array(0.25), np.array(100, np.uint8)]),
            ({"axis": 1}, [s, rng.uniform(0.1, 1, 3), np.array([1, -2, 3], np.int8)]),
            ({"axis": 2, "block_size": 3}, [q, rng.uniform(0.1, 1, (2, 3, 2))],
             range(21, 100)),
            ({}, [rng.integers(-1000, 1000, 6).astype(np.int32), np.array(0.125)])]


def dynamic_quantize_linear(rng):
    return [({}, [rng.uniform(-3, 5, (3, 4)).astype(np.float32)]),
            ({}, [rng.uniform(1, 5, (6,)).astype(np.float32)]),  # all positive: min is 0
            ({}, [-rng.uniform(1, 5, (2, 2)).astype(np.float32)])]


def mat_mul_integer(rng):
    a = rng.integers(0, 255, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 2)).astype(np.uint8)
    sa = rng.integers(-128, 127, (2, 3, 4)).astype(np.int8)
    return [({}, [a, b]), ({}, [a, b, np.array(12, np.uint8), np.array(200, np.uint8)]),
            (OracleLimit({}, 0, "onnx.reference cannot broadcast a per-row a_zero_point"),
             [a, b, np.array([1, 2, 3], np.uint8), np.array([4, 5], np.uint8)]),
            ({}, [sa, rng.integers(-128, 127, (4, 2)).astype(np.int8), np.array(-3, np.int8)])]


def q_linear_mat_mul(rng):
    a = rng.integers(0, 255, (2, 4)).astype(np.uint8)
    b = rng.integers(0, 255, (4, 3)).astype(np.uint8)
    f = np.float32
    return [({}, [a, f(0.02), np.array(113, np.uint8), b, f(0.01), np.array(114, np.uint8),
                  f(0.5), np.array(118, np.uint8)]),
            ({}, [a.astype(np.int8) // 2, f(0.03), np.array(-2, np.int8),
                  b.astype(np.int8) // 2, f(0.02), np.array(3, np.int8), f(0.4),
                  np.array(-5, np.int8)])]


def conv_integer(rng):
    x = rng.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    w = rng.integers(0, 255, (3, 2, 2, 2)).astype(np.uint8)
    return [({}, [x, w]), ({"pads": [1, 1, 1, 1]}, [x, w, np.array(100, np.uint8)]),
            ({"strides": [2, 2]}, [x, w, np.array(7, np.uint8),
                                   np.array([1, 2, 3], np.uint8)])]


def q_linear_conv(rng):
    x = rng.integers(0, 255, (1, 2, 4, 4)).astype(np.uint8)
    w = rng.integers(0, 255, (3, 2, 2, 2)).astype(np.uint8)
    f = np.float32
    return [({}, [x, f(0.02), np.array(120, np.uint8), w, f(0.01), np.array(110, np.uint8),
                  f(0.8), np.array(100, np.uint8)]),
            ({"pads": [1, 0, 1, 0]},
             [x, f(0.02), np.array(120, np.uint8), w, np.array([0.01, 0.02, 0.005], f),
              np.array(110, np.uint8), f(0.8), np.array(100, np.uint8),
              np.array([10, -20, 30], np.int32)])]


def non_max_suppression(rng):
    corners = rng.uniform(0, 10, (2, 6, 2, 2))
    boxes = np.concatenate([corners[..., 0, :], corners[..., 0, :] + rng.uniform(
        1, 4, (2, 6, 2))], axis=-1)  # [y1, x1, y2, x2]
    boxes[0, 3] = boxes[0, 2] + 0.1  # a near duplicate
    scores = rng.uniform(0, 1, (2, 3, 6))
    scores[0, 0, 4] = scores[0, 0, 1]  # a tie: the lower index first
    centre = np.concatenate([boxes[..., :2] + 1, boxes[..., 2:] - boxes[..., :2]], axis=-1)
    flipped = boxes[..., [2, 3, 0, 1]]
    i64, f32 = np.int64, np.float32
    return [({}, [boxes, scores, np.array([3], i64), np.array([0.3], f32)]),
            ({}, [boxes, scores, np.array([10], i64), np.array([0.1], f32),
                  np.array([0.4], f32)]),
            ({"center_point_box": 1}, [centre, scores, np.array([2], i64), np.array([0.2])]),
            ({}, [flipped, scores, np.array([6], i64), np.array([0.5], f32)]),
            # no limit given: nothing is kept (onnx.reference cannot omit the inputs)
            (OracleLimit({}, 0, "onnx.reference needs max_output_boxes_per_class"),
             [boxes, scores])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "NonMaxSuppression": non_max_suppression,
    "LpPool": lp_pool, "MaxUnpool": max_unpool, "Unique": unique,
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "DynamicQuantizeLinear": dynamic_quantize_linear, "MatMulInteger": mat_mul_integer,
    "QLinearMatMul": q_linear_mat_mul, "ConvInteger": conv_integer, "QLinearConv": q_linear_conv,
}
