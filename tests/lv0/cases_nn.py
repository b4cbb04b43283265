"""Test cases for the nn operators (see cases.py for the format).

Shapes are tiny on purpose: every float input element costs two forward calls in the gradient
check. Where onnx.reference itself is wrong, a case's attributes are an ``OracleLimit``, which
tells the forward test how many leading outputs to compare (0: none), with the reason.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


class OracleLimit(dict):
    """Operator attributes, plus how many outputs onnx.reference gets right for this case."""

    def __init__(self, attrs: dict, oracle_outputs: int, reason: str) -> None:
        super().__init__(attrs)
        self.oracle_outputs = oracle_outputs
        self.reason = reason


def _distinct(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values at least 0.01 apart, so no max ties and no kink within the difference step."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * 0.01 - n * 0.005 + rng.uniform(0, 1e-3, n)).reshape(shape)


def conv(rng: np.random.Generator) -> list:
    r = rng.standard_normal
    return [
        ({}, [r((2, 3, 6)), r((4, 3, 3)), r(4)]),  # 1-D
        ({"strides": [2], "dilations": [2], "pads": [2, 1]}, [r((1, 2, 9)), r((3, 2, 3))]),
        ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [r((2, 2, 4, 4)), r((3, 2, 3, 3)),
                                                          r(3)]),
        # groups, asymmetric pads, mixed strides and dilations
        ({"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]},
         [r((2, 4, 6, 7)), r((6, 2, 2, 3)), r(6)]),
        ({"group": 3}, [r((1, 3, 4, 4)), r((3, 1, 2, 2))]),  # depthwise
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [r((1, 2, 5, 6)), r((3, 2, 3, 2))]),
        ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, [r((1, 2, 5, 6)), r((3, 2, 3, 2))]),
        ({"auto_pad": "VALID", "strides": [3, 2]}, [r((1, 2, 7, 6)), r((2, 2, 2, 2))]),
        ({"strides": [1, 2, 1], "pads": [0, 1, 0, 1, 0, 1]},  # 3-D
         [r((1, 2, 3, 4, 3)), r((2, 2, 2, 3, 2)), r(2)]),
        # 2-D, the native kernel's cases: batch > 1 with groups, no bias, dilations and pads
        # wider than the kernel (outputs reading only padding), 1x1 (its GEMM-only path,
        # grouped) and 1x1 with a stride (the general path)
        ({"group": 2, "strides": [1, 2], "dilations": [2, 1], "pads": [2, 1, 1, 0]},
         [r((3, 4, 5, 6)), r((4, 2, 3, 2))]),
        ({"pads": [3, 0, 0, 3]}, [r((2, 1, 3, 3)), r((2, 1, 2, 2)), r(2)]),
        ({"group": 2}, [r((2, 4, 3, 3)), r((6, 2, 1, 1)), r(6)]),
        ({"strides": [2, 2]}, [r((2, 3, 4, 5)), r((2, 3, 1, 1))]),
    ]


def conv_transpose(rng: np.random.Generator) -> list:
    r = rng.standard_normal
    grouped = OracleLimit({"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1]}, 0,
                          "onnx.reference's grouped ConvTranspose slices W and B wrongly")
    return [
        ({}, [r((2, 3, 4)), r((3, 2, 3)), r(2)]),  # 1-D
        ({"strides": [2, 3], "pads": [1, 0, 0, 2], "dilations": [1, 2],
          "output_padding": [1, 1]}, [r((1, 2, 3, 3)), r((2, 3, 2, 3)), r(3)]),
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [r((1, 2, 3, 3)), r((2, 2, 3, 2))]),
        ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, [r((1, 2, 3, 3)), r((2, 2, 3, 2))]),
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2], "output_shape": [7, 5]},
         [r((1, 2, 3, 3)), r((2, 2, 3, 2))]),
        ({"strides": [1, 2, 1]}, [r((1, 2, 2, 3, 2)), r((2, 1, 2, 2, 2)), r(1)]),  # 3-D
        (grouped, [r((2, 4, 3, 2)), r((4, 3, 2, 2)), r(6)]),
    ]


def _pool_cases(rng: np.random.Generator) -> list:
    return [
        ({"kernel_shape": [3], "strides": [2]}, [_distinct(rng, (2, 2, 7))]),
        ({"kernel_shape": [2, 2], "strides": [2, 2]}, [_distinct(rng, (2, 2, 4, 6))]),
        ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1], "ceil_mode": 1},
         [_distinct(rng, (1, 2, 6, 5))]),
        ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
         [_distinct(rng, (1, 2, 5, 5))]),
        ({"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [2, 1]},
         [_distinct(rng, (1, 2, 5, 7))]),
        ({"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
         [_distinct(rng, (1, 2, 5, 5))]),
        ({"kernel_shape": [2, 2, 2], "strides": [2, 1, 2], "ceil_mode": 1},
         [_distinct(rng, (1, 2, 3, 4, 5))]),
    ]


def max_pool(rng: np.random.Generator) -> list:
    unit = "onnx.reference returns no valid Indices when every stride and dilation is 1"
    return [
        *_pool_cases(rng),
        ({"kernel_shape": [2, 3], "strides": [2, 2], "storage_order": 1},
         [_distinct(rng, (2, 2, 5, 7))]),
        (OracleLimit({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 1, unit),
         [_distinct(rng, (1, 2, 4, 5))]),
        (OracleLimit({"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}, 1, unit),
         [_distinct(rng, (1, 2, 4, 4))]),
        # batch > 1, pads, overlapping windows and column-major Indices together
        ({"kernel_shape": [3, 3], "strides": [2, 1], "pads": [1, 1, 1, 1], "storage_order": 1},
         [_distinct(rng, (2, 3, 5, 4))]),
    ]


def average_pool(rng: np.random.Generator) -> list:
    cases = []
    for attrs, inputs in _pool_cases(rng):
        for count_include_pad in (0, 1):
            cases.append(({**attrs, "count_include_pad": count_include_pad}, inputs))
    x = rng.standard_normal((1, 2, 4, 5))
    cases += [({"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER", "count_include_pad": c}, [x])
              for c in (0, 1)]
    x = rng.standard_normal((3, 2, 5, 6))  # batch > 1, overlapping dilated windows, pads
    cases += [({"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [1, 2],
                "pads": [1, 1, 2, 0], "count_include_pad": c}, [x]) for c in (0, 1)]
    return cases


def global_average_pool(rng: np.random.Generator) -> list:
    r = rng.standard_normal
    return [({}, [r((2, 3, 4))]), ({}, [r((2, 3, 3, 2))]), ({}, [r((1, 2, 2, 2, 3))])]


def batch_normalization(rng: np.random.Generator) -> list:
    cases = []
    new = range(14, 100)  # training_mode is an attribute from opset 14
    for shape in ((4, 3), (3, 2, 4), (2, 3, 2, 3)):
        c = shape[1]
        stats = [rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c),
                 rng.uniform(0.5, 2.0, c)]
        x = rng.standard_normal(shape)
        cases.append(({}, [x, *stats], new))
        cases.append(({"epsilon": 2.0**-10, "training_mode": 0}, [x, *stats], new))
        # ONNX float attributes are float32 (the reference's default momentum is
        # float32(0.9)), so training cases use values float32 holds exactly.
        cases.append(({"training_mode": 1, "momentum": 0.875}, [x, *stats], new))
        cases.append(({"training_mode": 1, "momentum": 0.5, "epsilon": 2.0**-7}, [x, *stats],
                      new))
        # Opsets 6-13: no training_mode. onnx.reference is wrong here: its opset 9-13 node
        # normalises with momentum-blended statistics whenever momentum is set (it always is,
        # by default), its opset 6-8 node trains unless is_test and returns a tuple as one
        # output, and it ignores spatial. tests/lv0/test_legacy_opsets.py checks these cases
        # against the opset-14 operator and formulas instead.
        blended = "onnx.reference's BatchNormalization-9 blends in the batch statistics"
        wrong = "onnx.reference's BatchNormalization-6 trains unless is_test, returning a tuple"
        cases.append((OracleLimit({}, 0, blended), [x, *stats], range(9, 14)))
        cases.append((OracleLimit({"epsilon": 2.0**-10}, 0, blended), [x, *stats],
                      range(9, 14)))
        cases.append((OracleLimit({"spatial": 1}, 0, wrong), [x, *stats], range(7, 9)))
        cases.append(({"is_test": 1, "epsilon": 2.0**-10}, [x, *stats], range(6, 7)))
        cases.append((OracleLimit({"momentum": 0.5}, 0, wrong), [x, *stats], range(6, 7)))
    x = rng.standard_normal((4, 3, 2))
    element = [rng.standard_normal((3, 2)), rng.standard_normal((3, 2)),
               rng.standard_normal((3, 2)), rng.uniform(0.5, 2.0, (3, 2))]
    ignored = "onnx.reference ignores spatial=0 (per-element statistics)"
    cases.append((OracleLimit({"spatial": 0}, 0, ignored), [x, *element], range(7, 9)))
    cases.append((OracleLimit({"spatial": 0, "is_test": 1}, 0, ignored), [x, *element],
                  range(6, 7)))
    cases.append((OracleLimit({"spatial": 0}, 0, ignored), [x, *element], range(6, 7)))
    return cases


def dropout(rng: np.random.Generator) -> list:
    x = rng.standard_normal((3, 4, 5))
    on, off = np.array(True), np.array(False)
    new = range(12, 100)  # ratio and training_mode are inputs from opset 12
    cases = [
        ({}, [x]),  # inference: identity
        ({}, [x, np.array(0.3)]),
        ({}, [x, np.array(0.3), off]),
        ({}, [x, np.array(0.0), on]),
        # Training with a seed draws onnx.reference's own mask, so the oracle still applies.
        ({"seed": 7}, [x, np.array(0.4), on]),
        ({"seed": 0}, [x.astype(np.float32).astype(np.float64), np.array(0.75), on]),
        (OracleLimit({"seed": 3}, 0, "onnx.reference cannot omit ratio before training_mode"),
         [x, None, on]),  # default ratio 0.5
    ]
    cases = [(*c, new) for c in cases]
    # Opsets 6-11: ratio is an attribute; inference (as written below 12) is the identity
    no_six = "onnx.reference has no Dropout before opset 7"
    return cases + [({}, [x], range(7, 12)), ({"ratio": 0.3}, [x], range(7, 12)),
                    (OracleLimit({"is_test": 1}, 0, no_six), [x], range(6, 7)),
                    (OracleLimit({"is_test": 0, "ratio": 0.0}, 0, no_six), [x], range(6, 7))]


def lrn(rng: np.random.Generator) -> list:
    # N == C: onnx.reference loops its channel window over range(N) instead of range(C).
    r = rng.standard_normal
    return [
        ({"size": 3}, [r((3, 3, 2, 2))]),
        # float32-exact attributes: ONNX stores floats as float32
        ({"size": 2, "alpha": 0.5, "beta": 0.625, "bias": 2.0}, [r((4, 4, 1, 2))]),
        ({"size": 5, "alpha": 0.3125}, [r((4, 4, 2, 1))]),  # alpha / size exact too
    ]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "Conv": conv,
    "ConvTranspose": conv_transpose,
    "MaxPool": max_pool,
    "AveragePool": average_pool,
    "GlobalAveragePool": global_average_pool,
    "BatchNormalization": batch_normalization,
    "Dropout": dropout,
    "LRN": lrn,
}
