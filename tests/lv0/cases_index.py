"""Test cases for the shape, indexing and contraction operators added for issue 16 (see
cases.py for the format). Integer data and zero-size tensors are covered op by op."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .cases_nn import OracleLimit
from .cases_tensor import ints


def expand(rng):
    r = rng.standard_normal
    return [({}, [r((3, 1)), ints(2, 3, 4)]), ({}, [r((3, 4)), ints(4)]),  # shape is smaller
            ({}, [r((2, 1, 4)), ints(3, 1)]), ({}, [r(()), ints(2, 2)]),
            ({}, [rng.integers(0, 5, (1, 3)), ints(2, 1)]), ({}, [r((0, 1)), ints(0, 3)])]


def tile(rng):
    r = rng.standard_normal
    return [({}, [r((2, 3)), ints(2, 1)]), ({}, [r((2, 3, 1)), ints(1, 2, 3)]),
            ({}, [r(3), ints(0)]), ({}, [rng.integers(0, 5, (2, 2)), ints(2, 2)]),
            ({}, [r((0, 2)), ints(3, 2)])]


def range_(rng):
    return [({}, [np.array(1, np.int64), np.array(10, np.int64), np.array(3, np.int64)]),
            ({}, [np.array(10, np.int32), np.array(1, np.int32), np.array(-2, np.int32)]),
            ({}, [np.array(0.5), np.array(2.0), np.array(0.25)]),
            ({}, [np.array(1.0, np.float32), np.array(5.0, np.float32),
                  np.array(2.0, np.float32)]),
            ({}, [np.array(5, np.int64), np.array(1, np.int64), np.array(1, np.int64)])]  # empty


def trilu(rng):
    x = rng.standard_normal((2, 3, 4))
    return [({}, [x]), ({"upper": 0}, [x]), ({}, [x, np.array(1, np.int64)]),
            ({"upper": 0}, [x, np.array(-1, np.int64)]), ({}, [x, np.array(-5, np.int64)]),
            ({}, [rng.integers(0, 9, (3, 3))]), ({}, [np.zeros((0, 3))])]


def gather_elements(rng):
    x = rng.standard_normal((3, 4))
    return [({}, [x, rng.integers(-3, 3, (2, 4))]),
            ({"axis": 1}, [x, rng.integers(0, 4, (3, 5))]),  # repeats add up
            ({"axis": 2}, [rng.standard_normal((2, 3, 2)), rng.integers(0, 2, (2, 3, 3))]),
            ({}, [rng.integers(0, 9, (3, 2)), rng.integers(0, 3, (2, 2))]),
            ({}, [x, np.zeros((0, 4), np.int64)])]


def _scatter_indices(rng, shape, axis_size, axis):
    """Distinct indices along ``axis`` (a permutation prefix per line): no write conflicts."""
    idx = np.stack([rng.permutation(axis_size)[:shape[axis]]
                    for _ in range(int(np.prod(shape)) // shape[axis])])
    return np.moveaxis(idx.reshape(*[n for i, n in enumerate(shape) if i != axis],
                                   shape[axis]), -1, axis).astype(np.int64)


def scatter_elements(rng):
    x = rng.standard_normal((3, 4))
    i0 = _scatter_indices(rng, (2, 4), 3, 0)
    i1 = _scatter_indices(rng, (3, 2), 4, 1)
    u0, u1 = rng.standard_normal((2, 4)), rng.uniform(0.5, 2, (3, 2))
    dup = np.array([[0, 0], [1, 1], [2, 0]], np.int64)  # add/mul with repeated positions
    distinct = (rng.permutation(12) * 0.1).reshape(3, 4)  # max/min without ties
    return [({}, [x, i0, u0]), ({"axis": 1}, [x, i1, u1]), ({"axis": -1}, [x, i1 - 4, u1]),
            ({"reduction": "add"}, [x, i0, u0], range(16, 100)),
            ({"axis": 1, "reduction": "add"}, [x, dup, u1], range(16, 100)),
            ({"axis": 1, "reduction": "mul"}, [x, dup, u1], range(16, 100)),
            ({"axis": 1, "reduction": "max"}, [distinct, i1, u1 + 0.05], range(18, 100)),
            ({"axis": 1, "reduction": "min"}, [distinct, i1, u1 - 0.55], range(18, 100)),
            ({}, [rng.integers(0, 9, (3, 4)), i0, rng.integers(0, 9, (2, 4))]),
            ({}, [x, np.zeros((0, 4), np.int64), np.zeros((0, 4))])]


def scatter(rng):
    x = rng.standard_normal((3, 4))
    deprecated = OracleLimit({}, 0, "onnx.reference has no Scatter (deprecated since opset 11)")
    return [(deprecated, [x, _scatter_indices(rng, (2, 4), 3, 0), rng.standard_normal((2, 4))]),
            (OracleLimit({"axis": 1}, 0, deprecated.reason),
             [x, _scatter_indices(rng, (3, 2), 4, 1), rng.standard_normal((3, 2))])]


def one_hot(rng):
    idx = rng.integers(-3, 3, (2, 3))
    values = np.array([-0.5, 2.0])
    return [({}, [idx, np.array(3, np.int64), values]), ({"axis": 0}, [idx, np.array(4), values]),
            ({"axis": 1}, [idx.astype(np.float64), np.array(3.0), values]),
            ({}, [np.array([0, 5, 1]), np.array(4), np.array([0, 1], np.int64)]),  # 5: all off
            ({}, [np.zeros((0,), np.int64), np.array(3), values])]


def size(rng):
    return [({}, [rng.standard_normal((2, 3))]), ({}, [np.zeros((0, 4))]),
            ({}, [np.array(True)])]


def cast_like(rng):
    x = rng.standard_normal((2, 3))
    return [({}, [x, np.zeros(1, np.float32)]), ({}, [x.astype(np.float32), np.zeros(0)]),
            ({}, [ints(1, 2, 3), np.zeros(1)]), ({}, [ints(0, 2), np.zeros(1, bool)])]


def non_zero(rng):
    return [({}, [rng.integers(0, 2, (3, 4)) * rng.standard_normal((3, 4))]),
            ({}, [rng.integers(0, 2, (2, 2, 3)).astype(bool)]), ({}, [np.zeros((0, 3))]),
            ({}, [ints(0, 3, 0, -1)])]


def depth_to_space(rng):
    x = rng.standard_normal((2, 8, 2, 3))
    return [({"blocksize": 2}, [x]), ({"blocksize": 2, "mode": "CRD"}, [x]),
            ({"blocksize": 2}, [rng.integers(0, 9, (1, 4, 1, 2))])]


def space_to_depth(rng):
    return [({"blocksize": 2}, [rng.standard_normal((2, 2, 4, 6))]),
            ({"blocksize": 3}, [rng.integers(0, 9, (1, 1, 3, 3))])]


def gather_nd(rng):
    x = rng.standard_normal((3, 4, 2))
    return [({}, [x, ints(0, 2, -1, 1, 0, 1).reshape(3, 2)]),
            ({}, [x, ints(2, 0, 2).reshape(3, 1)]),  # repeats: slices add up
            ({}, [x, ints(1, 2, 0).reshape(1, 3)]),
            ({"batch_dims": 1}, [x, ints(0, 3, 1).reshape(3, 1)]),
            ({"batch_dims": 1}, [x, ints(0, 1, 3, 0, 2, 1).reshape(3, 1, 2)]),
            ({}, [rng.integers(0, 9, (2, 2)), ints(1, 0).reshape(2, 1)])]


def scatter_nd(rng):
    x = rng.standard_normal((4, 3))
    idx = ints(2, 0).reshape(2, 1)
    u = rng.uniform(0.5, 2.0, (2, 3))
    dup = ints(1, 1, 3).reshape(3, 1)
    distinct = (rng.permutation(12) * 0.1).reshape(4, 3)
    return [({}, [x, idx, u]), ({}, [x, ints(1, 2, 3, 0).reshape(2, 2), u[:, 0]]),
            ({"reduction": "add"}, [x, dup, rng.standard_normal((3, 3))], range(16, 100)),
            ({"reduction": "mul"}, [x, dup, rng.uniform(0.5, 2, (3, 3))], range(16, 100)),
            ({"reduction": "max"}, [distinct, idx, u + 0.05], range(18, 100)),
            ({"reduction": "min"}, [distinct, idx, u - 2.55], range(18, 100)),
            ({}, [rng.integers(0, 9, (4, 3)), idx, rng.integers(0, 9, (2, 3))])]


def eye_like(rng):
    return [({}, [np.zeros((3, 4))]), ({"k": 1}, [np.zeros((3, 3), np.int32)]),
            ({"k": -2, "dtype": 1}, [np.zeros((4, 3))]), ({"dtype": 9}, [np.zeros((0, 2))])]


def einsum(rng):
    r = rng.standard_normal
    return [({"equation": "ij,jk->ik"}, [r((2, 3)), r((3, 4))]),
            ({"equation": "bij,bjk->bik"}, [r((2, 2, 3)), r((2, 3, 2))]),
            ({"equation": "ij->ji"}, [r((2, 3))]),
            ({"equation": "ij->"}, [r((2, 3))]),
            ({"equation": "ii->i"}, [r((3, 3))]),  # diagonal
            ({"equation": "ii"}, [r((3, 3))]),  # trace, implicit output
            ({"equation": "i,j"}, [r(3), r(2)]),  # outer product, implicit output
            ({"equation": "ij,kj"}, [r((2, 3)), r((4, 3))]),
            ({"equation": "i,i->i"}, [r(3), r(3)]),
            ({"equation": "ijk->k"}, [r((2, 3, 2))]),
            ({"equation": "...ij,...jk->...ik"}, [r((2, 1, 2, 3)), r((3, 3, 2))]),  # broadcast
            ({"equation": "bhqd,bhkd->bhqk"}, [r((1, 2, 3, 2)), r((1, 2, 4, 2))]),  # attention
            ({"equation": "ij,jk,kl->il"}, [r((2, 3)), r((3, 2)), r((2, 2))]),
            ({"equation": "ij,jk"}, [rng.integers(0, 5, (2, 3)), rng.integers(0, 5, (3, 2))]),
            ({"equation": "ij,jk->ik"}, [r((0, 3)), r((3, 2))])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "Expand": expand, "Tile": tile, "Range": range_, "Trilu": trilu,
    "GatherElements": gather_elements, "ScatterElements": scatter_elements, "Scatter": scatter,
    "OneHot": one_hot, "Size": size, "CastLike": cast_like, "NonZero": non_zero,
    "DepthToSpace": depth_to_space, "SpaceToDepth": space_to_depth, "GatherND": gather_nd,
    "ScatterND": scatter_nd, "EyeLike": eye_like, "Einsum": einsum,
}
