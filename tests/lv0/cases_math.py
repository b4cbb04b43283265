"""Test cases for the elementwise math, activation and logic operators (see cases.py for the
format).

Float inputs stay away from kinks (0 for Abs, integers for Floor/Round, thresholds of the
piecewise activations), because every case is also gradient-checked. Every op also gets an
empty (zero-size) case, and integer or bool cases where ONNX allows those types.
"""

from __future__ import annotations

import copy
from typing import Callable

import numpy as np

from .cases_nn import OracleLimit


def _away(rng, shape, points=(0.0,), gap=0.05, scale=2.0):
    """Uniform values in [-scale, scale] kept ``gap`` away from each of ``points``."""
    x = rng.uniform(-scale, scale, shape)
    for p in points:
        x = np.where(np.abs(x - p) < gap, x + 2 * gap, x)
    return x


def _not_integer(rng, shape):
    """Values whose fractional part is in [0.1, 0.4] or [0.6, 0.9]: no kink of floor/round."""
    whole = rng.integers(-3, 3, shape)
    frac = rng.uniform(0.1, 0.4, shape) + rng.integers(0, 2, shape) * 0.5
    return whole + frac


def _ints(rng, shape):
    return rng.integers(-5, 6, shape).astype(np.int64)


def _unary(make, attrs_list=({},), ints=False, extra=()):
    def cases(rng):
        out = [(copy.copy(a), [make(rng, s)]) for a in attrs_list for s in ((3, 4), (2, 3, 2))]
        out.append((copy.copy(attrs_list[0]), [make(rng, (0, 3))]))  # zero-size
        if ints:
            out += [({}, [_ints(rng, (2, 3))]), ({}, [_ints(rng, (2, 3)).astype(np.int32)])]
        return out + [c(rng) for c in extra]
    return cases


def _kinks(*points):
    return lambda rng, shape: _away(rng, shape, points)


def _in(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def is_nan(rng):
    x = np.array([[1.0, np.nan, -np.inf], [np.inf, 0.0, np.nan]])
    return [({}, [x]), ({}, [x.astype(np.float32)]), ({}, [np.zeros((0, 2))])]


def is_inf(rng):
    x = np.array([[1.0, np.nan, -np.inf], [np.inf, 0.0, -2.0]])
    return [({}, [x]), ({"detect_negative": 0}, [x]), ({"detect_positive": 0}, [x]),
            ({}, [x.astype(np.float32)]), ({}, [np.zeros((0, 2))])]


def not_(rng):
    return [({}, [rng.integers(0, 2, (3, 4)).astype(bool)]), ({}, [np.zeros((0,), bool)]),
            ({}, [np.array(True)])]


def erf_(rng):
    # float32: onnx.reference's Erf computes in float32 whatever the input type
    cases = _unary(_away)(rng) + [({}, [np.array([0.0, 3.0, -3.5, 6.0, 30.0, -1e10, 1e-8])])]
    return [(a, [x.astype(np.float32) for x in xs]) for a, xs in cases]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "Abs": _unary(_kinks(0.0), ints=True),
    "Neg": _unary(_away, ints=True),
    "Reciprocal": _unary(_kinks(0.0, -0.1, 0.1)),
    "Floor": _unary(_not_integer),
    "Ceil": _unary(_not_integer),
    "Round": _unary(_not_integer),  # halves to even: ONNX's node cases check those kinks
    "Sign": _unary(_kinks(0.0), ints=True,
                   extra=(lambda rng: ({}, [np.array([0, -1, 2], np.int64)]),)),
    "Erf": erf_,
    # onnx.reference expands Gelu into its function body, with float32 constants and a float32
    # Erf: tests/lv0/test_math_ops.py checks it against math.erf in float64 instead
    "Gelu": _unary(_away, (OracleLimit({}, 0, "onnx.reference's Gelu computes in float32"),
                           OracleLimit({"approximate": "tanh"}, 0, "float32 constants"))),
    "Softplus": lambda rng: _unary(_away)(rng) + [({}, [np.array([-800.0, 800.0, 0.0])])],
    "Softsign": _unary(_kinks(0.0)),
    "Elu": _unary(_kinks(0.0), ({}, {"alpha": 0.5})),
    "Selu": _unary(_kinks(0.0), ({}, {"alpha": 2.0, "gamma": 3.0})),
    "Celu": _unary(_kinks(0.0), ({}, {"alpha": 2.0})),
    "HardSigmoid": _unary(_kinks(-2.5, 2.5, -1.0, 1.0),
                          ({}, {"alpha": 0.5, "beta": 0.5})),
    "HardSwish": _unary(lambda rng, s: _away(rng, s, (-3.0, 3.0), scale=4.0)),
    "ThresholdedRelu": _unary(_kinks(1.0, 0.5), ({}, {"alpha": 0.5})),
    "Mish": _unary(_away),
    "Shrink": _unary(_kinks(-0.5, 0.5, -1.0, 1.0),
                     ({}, {"lambd": 1.0, "bias": 0.25})),
    "Sin": _unary(_away),
    "Cos": _unary(_away),
    "Tan": _unary(_in(-1.2, 1.2)),
    "Asin": _unary(_in(-0.9, 0.9)),
    "Acos": _unary(_in(-0.9, 0.9)),
    "Atan": _unary(_away),
    "Sinh": _unary(_away),
    "Cosh": _unary(_away),
    "Asinh": _unary(_away),
    "Acosh": _unary(_in(1.1, 3.0)),
    "Atanh": _unary(_in(-0.9, 0.9)),
    "IsNaN": is_nan,
    "IsInf": is_inf,
    "Not": not_,
}


# Broadcasting pairs (see cases_tensor.BROADCAST_SHAPES), fewer of them: these ops are simple.
PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3, 4)), ((0, 4), (4,))]


def _compare(rng):
    cases = []
    for a, b in PAIRS:
        x, y = rng.integers(-2, 3, a), rng.integers(-2, 3, b)
        cases += [({}, [x, y]), ({}, [x.astype(np.float64), y.astype(np.float64)]),
                  ({}, [x.astype(np.int32), y.astype(np.int32)])]
    return cases


def _logic(rng):
    return [({}, [rng.integers(0, 2, a).astype(bool), rng.integers(0, 2, b).astype(bool)])
            for a, b in PAIRS]


def _bitwise(rng):
    cases = []
    for dtype in (np.int32, np.uint8, np.int64):
        for a, b in PAIRS:
            cases.append(({}, [rng.integers(0, 100, a).astype(dtype),
                               rng.integers(0, 100, b).astype(dtype)]))
    return cases


def bitwise_not(rng):
    return [({}, [rng.integers(-50, 50, (3, 4)).astype(t)]) for t in (np.int32, np.int64)] + [
        ({}, [rng.integers(0, 200, (2, 3)).astype(np.uint8)]), ({}, [np.zeros((0, 2), np.int16)])]


def bit_shift(rng):
    x = rng.integers(0, 200, (3, 4)).astype(np.uint32)
    return [({"direction": "LEFT"}, [x, rng.integers(0, 5, (3, 4)).astype(np.uint32)]),
            ({"direction": "RIGHT"}, [x, np.array(2, np.uint32)]),
            ({"direction": "RIGHT"}, [x.astype(np.uint8), rng.integers(0, 3, 4).astype(np.uint8)]),
            ({"direction": "LEFT"}, [np.zeros((0, 4), np.uint64), np.ones(4, np.uint64)])]


def mod(rng):
    def pair(a_shape, b_shape):
        b = rng.uniform(0.7, 1.3, b_shape) * rng.choice([-1.0, 1.0], b_shape)
        # a / b = k + f with f in [0.2, 0.8]: no jump of the quotient within the step
        q = rng.integers(-3, 4, np.broadcast_shapes(a_shape, b_shape)) + rng.uniform(0.2, 0.8)
        return q * b, b  # a_shape is the broadcast shape in every case

    x, y = pair((3, 4), (3, 4))
    x2, y2 = pair((3, 4), (4,))
    ints_a, ints_b = rng.integers(-9, 10, (3, 4)), rng.choice([-4, -3, 2, 5], (3, 4))
    return [({}, [x, y]), ({"fmod": 1}, [x, y]), ({"fmod": 1}, [x2, y2]), ({}, [x2, y2]),
            ({}, [ints_a, ints_b]), ({"fmod": 1}, [ints_a, ints_b]),
            ({}, [ints_a.astype(np.int32), ints_b.astype(np.int32)]),
            ({}, [np.zeros((0, 4)), np.ones(4)])]


def where(rng):
    cond = rng.integers(0, 2, (3, 4)).astype(bool)
    r = rng.standard_normal
    return [({}, [cond, r((3, 4)), r((3, 4))]), ({}, [cond, r(4), r((2, 3, 1))]),
            ({}, [cond[0], r((3, 1)), np.array(1.5)]),
            ({}, [cond, rng.integers(0, 9, (3, 4)), rng.integers(0, 9, (4,))]),
            ({}, [np.zeros((0, 4), bool), r(4), r((0, 4))])]


def _choose(rng):
    # distinct values: no ties, where the gradient would jump
    def distinct(*shapes):
        sizes = [int(np.prod(s)) for s in shapes]
        values = rng.permutation(sum(sizes)) * 0.1 - 1.0
        out, start = [], 0
        for s, n in zip(shapes, sizes):
            out.append(values[start:start + n].reshape(s))
            start += n
        return out
    return [({}, distinct((3, 4))), ({}, distinct((3, 4), (3, 4))),
            ({}, distinct((3, 4), (4,), (3, 1))), ({}, distinct((2, 1, 4), (3, 1), ())),
            ({}, [rng.integers(-5, 5, (3, 4)), rng.integers(-5, 5, (4,))]),
            ({}, [rng.integers(-5, 5, (3, 4)).astype(np.int32)] * 2),
            ({}, [np.zeros((0, 4)), np.ones(4)])]


def mean(rng):
    r = rng.standard_normal
    # onnx.reference needs the widest input first
    return [({}, [r((3, 4))]), ({}, [r((3, 4)), r(4)]), ({}, [r((2, 3, 4)), r((3, 1)), r(())]),
            ({}, [np.zeros((0, 4)), np.ones(4)])]


def p_relu(rng):
    x = _away(rng, (2, 3, 4))
    channel = OracleLimit({}, 0, "onnx.reference broadcasts PRelu-6's 1-D slope numpy-style")
    return [({}, [x, rng.uniform(0.1, 0.5, (3, 1))]), ({}, [x, rng.uniform(0.1, 0.5, (4,))]),
            (channel, [x, rng.uniform(0.1, 0.5, (3,))], range(6, 7)),  # per channel (axis 1)
            ({}, [x, np.array(0.25)]), ({}, [x, rng.uniform(-1, 1, (2, 3, 4))]),
            ({}, [x, rng.uniform(0.1, 0.5, (1,))]),
            ({}, [rng.integers(-5, 5, (3, 4)), np.array([2] * 4)]),
            ({}, [np.zeros((0, 4)), np.ones(4)])]


CASES.update({
    "Equal": _compare, "Less": _compare, "Greater": _compare, "LessOrEqual": _compare,
    "GreaterOrEqual": _compare, "And": _logic, "Or": _logic, "Xor": _logic,
    "BitwiseAnd": _bitwise, "BitwiseOr": _bitwise, "BitwiseXor": _bitwise,
    "BitwiseNot": bitwise_not, "BitShift": bit_shift, "Mod": mod, "Where": where,
    "Max": _choose, "Min": _choose, "Mean": mean, "PRelu": p_relu,
})


def _reduction(make=lambda rng, s: rng.standard_normal(s), ints=True, empty=True):
    def cases(rng):
        x = make(rng, (2, 3, 4))
        old, new = range(1, 18), range(18, 100)
        out = [({}, [x]), ({"keepdims": 0}, [x]),
               ({"axes": [1]}, [x], old), ({"axes": [0, -1], "keepdims": 0}, [x], old),
               ({}, [x, ints_(1)], new), ({"keepdims": 0}, [x, ints_(0, -1)], new),
               ({}, [x, ints_()], new), ({"noop_with_empty_axes": 1}, [x], new),
               ({"noop_with_empty_axes": 1, "keepdims": 0}, [x, ints_(-2)], new)]
        if ints:
            out += [({"keepdims": 0}, [rng.integers(1, 4, (2, 3))]),
                    ({"axes": [1]}, [rng.integers(1, 4, (2, 3)).astype(np.int32)], old)]
        if empty:  # the empty set reduces to the identity; an empty kept axis stays empty
            out += [({"axes": [1]}, [np.zeros((2, 0, 3))], old),
                    ({}, [np.zeros((2, 0, 3)), ints_(1)], new),
                    ({"keepdims": 0}, [np.zeros((0, 3)), ints_(1)], new)]
        return out
    return cases


def ints_(*values):
    return np.array(values, dtype=np.int64)


def _distinct(rng, shape):
    return (rng.permutation(int(np.prod(shape))) * 0.1 - 1.0).reshape(shape)


def arg_extreme(rng):
    x = _distinct(rng, (2, 3, 4))
    ties = np.array([[1, 3, 3, 0], [2, 2, 1, 2]])
    return [({}, [x]), ({"axis": 1}, [x]), ({"axis": -1, "keepdims": 0}, [x]),
            ({"axis": 1, "select_last_index": 1}, [ties]), ({"axis": 1}, [ties]),
            ({"axis": 0, "keepdims": 0}, [ties.astype(np.float32)]),
            ({"axis": 1}, [np.zeros((0, 3))])]


def cum_sum(rng):
    x = rng.standard_normal((2, 3, 4))
    cases = [(dict(exclusive=e, reverse=r), [x, np.array(a, np.int64)])
             for e in (0, 1) for r in (0, 1) for a in (1, -1)]
    return cases + [({}, [rng.integers(0, 9, (3, 4)), np.array(0, np.int32)]),
                    ({"exclusive": 1}, [np.zeros((0, 3)), np.array(1)])]


def top_k(rng):
    x = _distinct(rng, (3, 5))
    ties = np.array([[3, 1, 3, 2, 1], [0, 0, 5, 5, 5]], np.int64)
    new = range(11, 100)
    return [({"axis": 1, "k": 2}, [x], range(1, 10)), ({"k": 5}, [x], range(1, 10)),
            ({}, [x, ints_(3)], range(10, 100)), ({"axis": 0}, [x, ints_(2)], range(10, 100)),
            ({"largest": 0}, [x, ints_(2)], new), ({"largest": 0, "axis": 0}, [x, ints_(3)], new),
            ({}, [ties, ints_(3)], range(10, 100)), ({"largest": 0}, [ties, ints_(4)], new),
            ({}, [x, ints_(0)], range(10, 100)), ({"axis": 0}, [np.zeros((0, 3)), ints_(0)], new)]


CASES.update({
    "ReduceMax": _reduction(), "ReduceMin": _reduction(), "ReduceProd": _reduction(),
    "ReduceL1": _reduction(lambda rng, s: _away(rng, s)), "ReduceL2": _reduction(),
    "ReduceSumSquare": _reduction(),
    "ReduceLogSum": _reduction(lambda rng, s: rng.uniform(0.5, 2, s), ints=False, empty=False),
    "ReduceLogSumExp": _reduction(ints=False),
    "ArgMax": arg_extreme, "ArgMin": arg_extreme, "CumSum": cum_sum, "TopK": top_k,
})
