"""Test cases for the tensor operators (see cases.py for the format).

Operators whose attributes became inputs in some opset carry the opsets a case is valid at as a
third element. Inputs stay inside each op's domain (Log, Sqrt, Pow) and away from kinks (Clip
bounds, LeakyRelu at 0), because every case is also gradient-checked.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

INT64_MAX, INT64_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def before(opset: int) -> range:
    return range(1, opset)


def since(opset: int) -> range:
    return range(opset, 100)


def ints(*values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _nonzero(rng: np.random.Generator, shape) -> np.ndarray:
    """|x| in [0.5, 2]: safe to divide by and away from kinks at 0."""
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def _avoiding(rng: np.random.Generator, shape, points, gap: float = 0.05) -> np.ndarray:
    """Uniform values in [-1.5, 1.5] kept ``gap`` away from each of ``points``."""
    x = rng.uniform(-1.5, 1.5, shape)
    for p in points:
        x = np.where(np.abs(x - p) < gap, x + 2 * gap, x)
    return x


# Broadcasting pairs: equal, trailing, leading, both stretched, scalar on either side.
# The last two are a conv bias's shapes: (1, C, 1, 1) and (C, 1, 1) against (N, C, H, W).
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)), ((2, 1, 4), (3, 1)),
                    ((), (3, 4)), ((3, 4), ()), ((2, 3), (1, 1)),
                    ((2, 3, 2, 2), (1, 3, 1, 1)), ((3, 1, 1), (2, 3, 2, 2))]


def _binary(make_b: Callable | None = None):
    def cases(rng):
        from .cases_nn import OracleLimit

        make = make_b or (lambda r, s: r.standard_normal(s))
        r = rng.standard_normal
        legacy = "onnx.reference broadcasts numpy-style, ignoring opset 6's axis attribute"
        return [({}, [r(a), make(rng, b)], since(7)) for a, b in BROADCAST_SHAPES] + [
            ({}, [r((3, 4)), make(rng, (3, 4))], before(7)),  # opset 6: same shapes, or
            ({"broadcast": 1}, [r((2, 3, 4)), make(rng, (4,))], before(7)),  # B at the end
            ({"broadcast": 1}, [r((2, 3, 4)), make(rng, (3, 4))], before(7)),
            (OracleLimit({"broadcast": 1, "axis": 1}, 0, legacy),  # B at axis 1
             [r((2, 3, 4)), make(rng, (3,))], before(7)),
            (OracleLimit({"broadcast": 1, "axis": 0}, 0, legacy),
             [r((2, 3)), make(rng, (2,))], before(7))]
    return cases


def mat_mul(rng):
    pairs = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
             ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (2, 4, 3)),
             ((2, 3, 4), (4,)), ((2, 3, 3, 4), (2, 3, 4, 5))]  # the last: equal batches
    return [({}, [rng.standard_normal(a), rng.standard_normal(b)]) for a, b in pairs]


def pow_(rng):
    from .cases_nn import OracleLimit

    base = rng.uniform(0.5, 2.0, (3, 4))
    return [({}, [base, rng.uniform(-2, 2, (3, 4))]),
            ({}, [base, rng.uniform(-2, 2, (4,))], since(7)),
            ({}, [rng.uniform(0.5, 2.0, (4,)), rng.uniform(-2, 2, (3, 1))], since(7)),
            ({}, [base, np.array(2.0)], since(7)),
            ({}, [_nonzero(rng, (2, 3)), ints(2, 3, -1)], since(7)),  # any sign, int exponents
            (OracleLimit({"broadcast": 1}, 0, "onnx.reference's Pow-1 has no broadcast attribute"),
             [base, rng.uniform(-2, 2, (4,))], before(7))]


def sum_(rng):
    return [({}, [rng.standard_normal((3, 4))]),
            ({}, [rng.standard_normal((3, 4)), rng.standard_normal((3, 4))]),
            ({}, [rng.standard_normal((3, 4)), rng.standard_normal(4),
                  rng.standard_normal((3, 1)), rng.standard_normal(())])]


def _unary(make: Callable, attrs_list=({},)):
    def cases(rng):
        return [(dict(attrs), [make(rng, shape)]) for attrs in attrs_list
                for shape in ((3, 4), (2, 3, 2))]
    return cases


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _positive(rng, shape):
    return rng.uniform(0.5, 3.0, shape)


def _wide(rng, shape):
    return rng.standard_normal(shape) * 8  # reaches where exp(-x) would overflow a naive sigmoid


def _softmax_like(rng):
    x2, x3 = rng.standard_normal((3, 5)), rng.standard_normal((2, 3, 4))
    # Where both forms agree (2-D, or the last axis) the cases serve every version; a single
    # inner axis is the opset 13 form (before it the input is coerced to 2-D, which
    # onnx.reference does not model: tests/lv0/test_broadcast_ops.py checks that form).
    return [({}, [x2]), ({"axis": 1}, [x2]), ({"axis": -1}, [x2]), ({"axis": 0}, [x2], since(13)),
            ({"axis": 2}, [x3]), ({"axis": -1}, [x3]),
            ({}, [x3], since(13)), ({"axis": 1}, [x3], since(13)), ({"axis": 0}, [x3], since(13))]


def clip(rng):
    x = _avoiding(rng, (3, 4), (-0.5, 0.5))
    lo, hi = np.array(-0.5), np.array(0.5)
    return [({"min": -0.5, "max": 0.5}, [x], before(11)), ({"min": -0.5}, [x], before(11)),
            ({"max": 0.5}, [x], before(11)), ({}, [x]),
            ({}, [x, lo, hi], since(11)), ({}, [x, lo], since(11)),
            ({}, [x, None, hi], since(11)),
            ({}, [x, hi, lo], since(11))]  # min > max: everything becomes max


def identity(rng):
    return [({}, [rng.standard_normal((3, 4))]), ({}, [ints(1, 2, 3)])]


def transpose(rng):
    x = rng.standard_normal((2, 3, 4))
    return [({}, [x]), ({"perm": [1, 0, 2]}, [x]), ({"perm": [2, 0, 1]}, [x]),
            ({}, [rng.standard_normal((3, 5))])]


def concat(rng):
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((1, 3))
    return [({"axis": 0}, [a, b, rng.standard_normal((3, 3))]),
            ({"axis": 1}, [a, rng.standard_normal((2, 1))]),
            ({"axis": -1}, [rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 2, 1))]),
            ({"axis": 0}, [a])]


def split(rng):
    x = rng.standard_normal((3, 6))
    return [({"axis": 1, "split": [1, 2, 3]}, [x], before(13)),
            ({"split": [1, 2]}, [x], before(13)),
            ({"axis": 1}, [x, ints(1, 2, 3)], since(13)),
            ({"axis": -2}, [x, ints(2, 1)], since(13)),
            ({"axis": 1, "num_outputs": 3}, [x], since(18)),
            ({"axis": -1, "num_outputs": 4}, [rng.standard_normal((2, 7))], since(18))]  # 2,2,2,1


def slice_(rng):
    x = rng.standard_normal((4, 5, 6))
    as_attrs = [({"starts": [1], "ends": [3], "axes": [0]}, [x], before(10)),
                ({"starts": [0, -3], "ends": [1000, -1]}, [x], before(10)),
                ({"starts": [-2], "ends": [INT64_MAX], "axes": [-1]}, [x], before(10))]
    as_inputs = [
        ([1], [3], [0], None),
        ([0, -3], [INT64_MAX, -1], [1, 2], None),
        ([0, -1], [5, -100], [1, 2], [2, -1]),  # a step, and a negative step to the start
        ([INT64_MAX], [INT64_MIN], [-1], [-2]),  # every other element, reversed
        ([1, 0], [3, 2], None, None),  # no axes: the first ones
        ([3], [1], [0], None),  # empty
        ([-10], [10], [0], [3]),  # clamped at both ends
    ]
    return as_attrs + [
        ({}, [x, ints(*s), ints(*e), None if a is None else ints(*a),
              None if st is None else ints(*st)], since(10))
        for s, e, a, st in as_inputs]


def gather(rng):
    return [({}, [rng.standard_normal((5, 3)), ints(0, 2, 2, -1, 2)]),  # repeats: scatter-add
            ({"axis": 1}, [rng.standard_normal((2, 3)), ints(0, 1, 2, 0).reshape(2, 2)]),
            ({"axis": -1}, [rng.standard_normal((2, 3, 4)), ints(-1, 0, -1)]),
            ({"axis": 1}, [rng.standard_normal((2, 3, 4)), np.array(-2, np.int64)]),  # scalar
            ({}, [ints(10, 20, 30), ints(2, 0)])]  # int data: no gradient


def squeeze(rng):
    x = rng.standard_normal((1, 3, 1, 2))
    return [({}, [x]),  # every size-1 axis
            ({"axes": [0, 2]}, [x], before(13)), ({"axes": [-2]}, [x], before(13)),
            ({}, [x, ints(0, -2)], since(13)), ({}, [x, ints(2)], since(13))]


def unsqueeze(rng):
    x = rng.standard_normal((3, 4))
    return [({"axes": [0]}, [x], before(13)), ({"axes": [1, -1]}, [x], before(13)),
            ({}, [x, ints(0)], since(13)), ({}, [x, ints(-1)], since(13)),
            ({}, [x, ints(0, 3)], since(13)), ({}, [x, ints(1, -1)], since(13)),
            ({}, [np.array(2.5), ints(0, 1)], since(13))]


def _reduce(new_since: int):
    def cases(rng):
        x = rng.standard_normal((2, 3, 4))
        old, new = before(new_since), since(new_since)
        return [({}, [x]), ({"keepdims": 0}, [x]),  # every axis, in all versions
                ({"axes": [1]}, [x], old), ({"axes": [0, -1], "keepdims": 0}, [x], old),
                ({}, [x, ints(1)], new), ({"keepdims": 0}, [x, ints(0, -1)], new),
                ({}, [x, ints()], new),  # empty axes: every axis
                ({"noop_with_empty_axes": 1}, [x], new),  # identity
                ({"noop_with_empty_axes": 1, "keepdims": 0}, [x, ints(-2)], new)]
    return cases


def pad(rng):
    x = rng.standard_normal((3, 4))
    value = np.array(1.5)
    return [
        ({"pads": [1, 0, 2, 1]}, [x], before(11)),
        ({"pads": [1, 2, 0, 1], "value": 2.0}, [x], before(11)),
        ({"pads": [1, 2, 2, 1], "mode": "reflect"}, [x], before(11)),
        ({"pads": [0, 3, 2, 0], "mode": "edge"}, [x], before(11)),
        ({}, [x, ints(1, 0, 2, 1)], since(11)),
        ({}, [x, ints(1, 2, 0, 1), value], since(11)),
        ({"mode": "reflect"}, [x, ints(1, 2, 2, 1), value], since(11)),  # value unused
        ({"mode": "reflect"}, [x, ints(2, 3, 2, 3)], since(11)),
        ({"mode": "edge"}, [x, ints(0, 3, 2, 0)], since(11)),
        ({}, [x, ints(1, 2), value, ints(-1)], since(18)),
        ({"mode": "edge"}, [x, ints(2, 0), None, ints(0)], since(18)),
        ({"mode": "wrap"}, [x, ints(1, 2, 2, 3)], since(19)),
    ]


def constant(rng):
    return [({"value": rng.standard_normal((2, 3))}, []), ({"value": ints(4, 5)}, []),
            ({"value_float": 1.5}, []), ({"value_floats": [1.0, -2.0]}, []),
            ({"value_int": 3}, []), ({"value_ints": [1, 2, 3]}, [])]


def constant_of_shape(rng):
    return [({}, [ints(2, 3)]), ({"value": np.array([1.5])}, [ints(3)]),
            ({"value": ints(7)}, [ints(2, 1, 2)]), ({"value": np.array([2.0])}, [ints()])]


def shape(rng):
    x = rng.standard_normal((2, 3, 4))
    return [({}, [x]), ({}, [np.array(1.0)]),
            ({"start": 1}, [x], since(15)), ({"end": -1}, [x], since(15)),
            ({"start": -2, "end": 10}, [x], since(15)), ({"start": 2, "end": 1}, [x], since(15))]


def cast(rng):
    x = rng.standard_normal((3, 4)) * 3
    return [({"to": 11}, [x]),  # double -> double
            ({"to": 7}, [x]),  # double -> int64, truncating
            ({"to": 9}, [x]),  # double -> bool
            ({"to": 11}, [ints(-2, 0, 5)]),  # int64 -> double
            ({"to": 1}, [ints(-2, 0, 5)]),  # int64 -> float
            ({"to": 6}, [ints(-2, 0, 5)]),  # int64 -> int32
            ({"to": 11}, [np.array([True, False])])]


def _log_probs(rng, shape):
    x = rng.standard_normal(shape)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def negative_log_likelihood_loss(rng):
    logp, target = _log_probs(rng, (5, 4)), rng.integers(0, 4, 5)
    logp3, target3 = _log_probs(rng, (3, 4, 2)), rng.integers(0, 4, (3, 2))
    logp4, target4 = _log_probs(rng, (2, 3, 2, 2)), rng.integers(0, 3, (2, 2, 2))
    weight = rng.uniform(0.5, 2.0, 4)
    ignored = target.copy()
    ignored[1] = -1
    cases = []
    for reduction in ("mean", "sum", "none"):
        cases += [({"reduction": reduction}, [logp, target]),
                  ({"reduction": reduction}, [logp, target, weight]),
                  ({"reduction": reduction, "ignore_index": -1}, [logp, ignored, weight]),
                  # onnx.reference averages over ignored elements too when ignore_index is -1
                  # and there are no weights; another index avoids that bug.
                  ({"reduction": reduction, "ignore_index": 1}, [logp, target]),
                  ({"reduction": reduction}, [logp3, target3, weight]),
                  ({"reduction": reduction}, [logp4, target4])]
    return cases


def mean_squared_error(prediction, target, reduction="mean"):
    """The oracle of ai.meta::MeanSquaredError (onnx.reference does not know the domain)."""
    err = (prediction - target) ** 2
    return {"mean": np.mean, "sum": np.sum, "none": np.asarray}[reduction](err)


def mean_squared_error_cases(rng):
    return [({"reduction": r}, [rng.standard_normal(s), rng.standard_normal(s)])
            for r in ("mean", "sum", "none") for s in ((3, 4), (5,))]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "MatMul": mat_mul,
    "Add": _binary(),
    "Sub": _binary(),
    "Mul": _binary(),
    "Div": _binary(_nonzero),
    "Pow": pow_,
    "Sum": sum_,
    "LeakyRelu": _unary(_nonzero, ({}, {"alpha": 0.2})),
    "Sigmoid": _unary(_wide),
    "Tanh": _unary(_normal),
    "Exp": _unary(_normal),
    "Log": _unary(_positive),
    "Sqrt": _unary(_positive),
    "Softmax": _softmax_like,
    "LogSoftmax": _softmax_like,
    "Clip": clip,
    "Identity": identity,
    "Transpose": transpose,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "Gather": gather,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "ReduceSum": _reduce(13),
    "ReduceMean": _reduce(18),
    "Pad": pad,
    "Constant": constant,
    "ConstantOfShape": constant_of_shape,
    "Shape": shape,
    "Cast": cast,
    "NegativeLogLikelihoodLoss": negative_log_likelihood_loss,
    "MeanSquaredError": mean_squared_error_cases,
}
