"""Test cases for the sequence and optional operators (see cases.py). Sequences are Python
lists of arrays, empty optionals None; these operators run forward only, but for
``SEQUENCE_GRAD_OPS`` (a gradient flows through ``Tensor.split`` as PyTorch's dynamo exporter
writes it; tests/lv1/test_default_exports.py checks it by central differences):
``SEQUENCE_OPS`` tells the registry-driven tests so."""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from .cases_control import Scoped


def _seq(rng, *shapes):
    return [rng.standard_normal(s) for s in shapes]


def sequence_empty(rng):
    return [({}, []), ({"dtype": TensorProto.INT64}, [])]


def sequence_construct(rng):
    return [({}, _seq(rng, (2, 3), (4,), ())), ({}, [np.arange(3)])]


def sequence_insert(rng):
    seq = _seq(rng, (2,), (3,))
    return [({}, [seq, rng.standard_normal(4)]),
            ({}, [seq, rng.standard_normal(1), np.array(0, np.int64)]),
            ({}, [seq, rng.standard_normal(1), np.array(-1, np.int64)])]


def sequence_at(rng):
    seq = _seq(rng, (2,), (3,), (1, 2))
    return [({}, [seq, np.array(1, np.int64)]), ({}, [seq, np.array(-1, np.int32)])]


def sequence_erase(rng):
    seq = _seq(rng, (2,), (3,), (1, 2))
    return [({}, [seq]), ({}, [seq, np.array(0, np.int64)]), ({}, [seq, np.array(-2)])]


def sequence_length(rng):
    return [({}, [_seq(rng, (2,), (3,))]), ({}, [[]])]


def split_to_sequence(rng):
    x = rng.standard_normal((5, 4))
    return [({}, [x]), ({"axis": 1, "keepdims": 0}, [x]),
            ({}, [x, np.array(2, np.int64)]), ({"axis": -1}, [x, np.array([1, 3], np.int64)])]


def concat_from_sequence(rng):
    seq = _seq(rng, (2, 3), (2, 3), (2, 3))
    return [({"axis": 0}, [seq]), ({"axis": -1}, [seq]), ({"axis": 1, "new_axis": 1}, [seq]),
            ({"axis": -1, "new_axis": 1}, [seq])]


def sequence_map(rng):
    v = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "w"], ["m"]),
         helper.make_node("Shape", ["a"], ["shape"])], "body",
        [v("a", TensorProto.DOUBLE, None), v("b", TensorProto.DOUBLE, None)],
        [v("m", TensorProto.DOUBLE, None), v("shape", TensorProto.INT64, None)])
    w = rng.standard_normal(())
    seq = _seq(rng, (2,), (3,))

    def oracle(inputs, outer):  # onnx.reference's SequenceMap cannot read outer tensors
        a, b = inputs
        bs = b if isinstance(b, list) else [b] * len(a)
        return [[(x + y) * outer["w"] for x, y in zip(a, bs)],
                [np.array(x.shape, np.int64) for x in a]]
    return [(Scoped({"body": body}, {"w": w}, oracle), [seq, _seq(rng, (2,), (3,))]),
            (Scoped({"body": body}, {"w": w}, oracle), [seq, rng.standard_normal(1)])]


def optional(rng):
    x = rng.standard_normal(3)
    opt = "onnx.reference declares no output type for a bare Optional"
    from .cases_nn import OracleLimit
    return [(OracleLimit({}, 0, opt), [x]),
            (OracleLimit({"type": helper.make_tensor_type_proto(TensorProto.DOUBLE, None)}, 0,
                         opt), [None])]


def optional_has_element(rng):
    return [({}, [rng.standard_normal(3)]), ({}, [None]), ({}, [_seq(rng, (2,))])]


def optional_get_element(rng):
    return [({}, [rng.standard_normal(3)]), ({}, [_seq(rng, (2,), (1,))])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "SequenceEmpty": sequence_empty, "SequenceConstruct": sequence_construct,
    "SequenceInsert": sequence_insert, "SequenceAt": sequence_at,
    "SequenceErase": sequence_erase, "SequenceLength": sequence_length,
    "SplitToSequence": split_to_sequence, "ConcatFromSequence": concat_from_sequence,
    "SequenceMap": sequence_map, "Optional": optional,
    "OptionalHasElement": optional_has_element, "OptionalGetElement": optional_get_element,
}
SEQUENCE_OPS = set(CASES)
SEQUENCE_GRAD_OPS = {"SplitToSequence", "SequenceAt"}
