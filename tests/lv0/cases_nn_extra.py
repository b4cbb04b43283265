"""Test cases for the normalization operators added for issue 16 (see cases.py for the format)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .cases_nn import OracleLimit


def layer_normalization(rng):
    r = rng.standard_normal
    x = r((2, 3, 4))
    return [({}, [x, r(4), r(4)]), ({"axis": 1}, [x, r((3, 4)), r((3, 4))]),
            ({"axis": -2, "epsilon": 0.1}, [x, r((3, 4))]), ({"axis": 0}, [x, r((2, 3, 4))]),
            ({}, [x.astype(np.float32), r(4).astype(np.float32), r(4).astype(np.float32)]),
            ({}, [np.zeros((0, 4)), r(4), r(4)])]


def instance_normalization(rng):
    r = rng.standard_normal
    return [({}, [r((2, 3, 4)), r(3), r(3)]), ({"epsilon": 0.01}, [r((1, 2, 3, 2)), r(2), r(2)])]


def group_normalization(rng):
    r = rng.standard_normal
    x = r((2, 4, 3))
    # onnx.reference runs opset 21's function body, statistics in float32 (stash_type=1):
    # tests/lv0/test_math_ops.py compares with it at float32 tolerance
    limit = "onnx.reference computes GroupNormalization-21 statistics in float32"
    return [(OracleLimit({"num_groups": 2}, 0, limit), [x, r(4), r(4)], range(21, 100)),
            (OracleLimit({"num_groups": 4, "epsilon": 0.01}, 0, limit),
             [r((1, 4, 2, 2)), r(4), r(4)], range(21, 100)),
            ({"num_groups": 2}, [x, r(2), r(2)], range(18, 21)),
            ({"num_groups": 1}, [r((1, 2, 2, 2)), r(1), r(1)], range(18, 21))]


def lp_normalization(rng):
    x = rng.standard_normal((3, 4))
    return [({}, [x]), ({"axis": 0}, [x]), ({"p": 1}, [rng.uniform(0.5, 2, (3, 4))]),
            ({"p": 1, "axis": 0}, [rng.uniform(0.5, 2, (2, 3, 2))]),
            ({}, [np.zeros((0, 3))])]


def mean_variance_normalization(rng):
    # float32: onnx.reference runs the function body, whose epsilon constant is float32
    def r(shape):
        return rng.standard_normal(shape).astype(np.float32)
    return [({}, [r((2, 3, 2, 2))]), ({"axes": [1]}, [r((2, 3, 2))]),
            ({"axes": [0, 1]}, [r((2, 3))])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "LayerNormalization": layer_normalization,
    "InstanceNormalization": instance_normalization,
    "GroupNormalization": group_normalization,
    "LpNormalization": lp_normalization,
    "MeanVarianceNormalization": mean_variance_normalization,
}


def _distinct(rng, shape):
    return (rng.permutation(int(np.prod(shape))) * 0.1 - 1.0).reshape(shape)


def hardmax(rng):
    x, x2 = _distinct(rng, (2, 3, 4)), _distinct(rng, (3, 4))
    new = range(13, 100)  # onnx.reference does not model the coerced 2-D form before 13
    return [({}, [x], new), ({"axis": 0}, [x], new), ({"axis": 1}, [x], new),
            ({"axis": 1}, [x2]), ({"axis": -1}, [x2]), ({}, [np.zeros((0, 3))], new)]


def compress(rng):
    x = rng.standard_normal((3, 4))
    return [({"axis": 0}, [x, np.array([True, False, True])]),
            ({"axis": -1}, [x, np.array([False, True, True])]),  # shorter than the axis
            ({}, [x, np.array([1, 0, 0, 1, 1], bool)]),
            ({"axis": 1}, [rng.integers(0, 9, (2, 3)), np.array([0, 1, 1], bool)])]


def cum_prod(rng):
    x = rng.uniform(0.5, 1.5, (2, 3)) * rng.choice([-1, 1], (2, 3))
    return [(dict(exclusive=e, reverse=r), [x, np.array(a)])
            for e in (0, 1) for r in (0, 1) for a in (1, -2)] + [
        ({}, [rng.integers(1, 4, (2, 3)), np.array(1, np.int32)])]


def global_max_pool(rng):
    # 4-D only: onnx.reference drops a 3-D input's channel axis
    return [({}, [_distinct(rng, (2, 3, 2, 2))]), ({}, [_distinct(rng, (1, 2, 3, 3))])]


def reverse_sequence(rng):
    return [({}, [rng.standard_normal((4, 3, 2)), np.array([4, 2, 0], np.int64)]),
            ({"batch_axis": 0, "time_axis": 1},
             [rng.standard_normal((2, 3)), np.array([1, 3], np.int64)]),
            ({}, [rng.integers(0, 9, (3, 2)), np.array([3, 2], np.int64)])]


def swish(rng):
    x = rng.standard_normal((3, 4)) * 2
    return [({}, [x]), ({"alpha": 0.5}, [x]), ({}, [np.zeros((0, 2))])]


def det(rng):
    return [({}, [rng.standard_normal((3, 3))]), ({}, [rng.standard_normal((2, 2, 2))])]


def rms_normalization(rng):
    # onnx.reference runs the function body with its statistics in float32 (stash_type=1)
    limit = "onnx.reference computes RMSNormalization statistics in float32"
    x = rng.standard_normal((2, 3, 4))
    return [(OracleLimit({}, 0, limit), [x, rng.standard_normal(4)]),
            (OracleLimit({"axis": 1, "epsilon": 0.1}, 0, limit), [x, rng.standard_normal((3, 4))])]


def _window(rng):
    limit = "onnx.reference computes the window in float32, meta in float64 then casts"
    return [(OracleLimit({}, 0, limit), [np.array(8)]),
            (OracleLimit({"periodic": 0}, 0, limit), [np.array(5, np.int32)]),
            (OracleLimit({"output_datatype": 11}, 0, limit), [np.array(6)])]


CASES.update({
    "Hardmax": hardmax, "Compress": compress, "CumProd": cum_prod,
    "GlobalMaxPool": global_max_pool, "ReverseSequence": reverse_sequence, "Swish": swish,
    "Det": det, "RMSNormalization": rms_normalization, "HannWindow": _window,
    "HammingWindow": _window, "BlackmanWindow": _window,
})
