"""Test cases for the ai.onnx.preview.training optimizers (see cases.py), and their oracle:
onnx.reference, which knows that domain."""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

DOMAIN = "ai.onnx.preview.training"
STATES = {"Adagrad": 1, "Momentum": 1, "Adam": 2}


def training_oracle(op_type: str) -> Callable:
    """A function of (*inputs, **attrs) running the op through onnx.reference."""
    def run(*inputs, **attrs):
        per = 2 + STATES[op_type]
        n = (len(inputs) - 2) // per
        names = [f"x{i}" for i in range(len(inputs))]
        outs = [f"y{i}" for i in range(n * (per - 1))]
        node = helper.make_node(op_type, names, outs, domain=DOMAIN,
                                **{k: v for k, v in attrs.items() if v is not None})
        graph = helper.make_graph(
            [node], "oracle",
            [helper.make_tensor_value_info(
                n_, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), None)
             for n_, x in zip(names, inputs)],
            [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                        helper.make_opsetid(DOMAIN, 1)])
        feeds = {n_: np.asarray(x) for n_, x in zip(names, inputs)}
        return tuple(ReferenceEvaluator(model).run(None, feeds))
    return run


# ONNX float attributes are float32: the values below are exact in float32, so the oracle
# (which reads them from a model) and the op (given them directly) agree to the last bit.

def _common(rng, states):
    x, g = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    x2, g2 = rng.standard_normal(4), rng.standard_normal(4)
    one = [x, g, *(rng.uniform(0.1, 1, (2, 3)) for _ in range(states))]
    two = [x, x2, g, g2, *(v for _ in range(states) for v in
                            (rng.uniform(0.1, 1, (2, 3)), rng.uniform(0.1, 1, 4)))]
    return one, two


def adagrad(rng):
    one, two = _common(rng, 1)
    r, t = np.array(0.1), np.array(3, np.int64)
    return [({"decay_factor": 0.125, "epsilon": 2.0**-17, "norm_coefficient": 2.0**-10},
             [r, t, *one]),
            ({"epsilon": 2.0**-20}, [r, np.array(0, np.int64), *two])]


def adam(rng):
    one, _ = _common(rng, 2)
    r = np.array(0.1)
    return [({"alpha": 0.875, "beta": 1 - 2.0**-10, "epsilon": 2.0**-23,
              "norm_coefficient": 2.0**-10, "norm_coefficient_post": 2.0**-7},
             [r, np.array(2, np.int64), *one]),
            # (one tensor: onnx.reference casts multi-tensor Adam's outputs to float32)
            ({"epsilon": 2.0**-20, "alpha": 0.75, "beta": 0.875},
             [r, np.array(0, np.int64), *one])]


def momentum(rng):
    one, two = _common(rng, 1)
    r, attrs = np.array(0.1), {"alpha": 0.875, "beta": 0.5, "norm_coefficient": 2.0**-7}
    return [({**attrs, "mode": "standard"}, [r, np.array(2, np.int64), *one]),
            ({**attrs, "mode": "nesterov"}, [r, np.array(1, np.int64), *two]),
            ({**attrs, "mode": "standard"}, [r, np.array(0, np.int64), *two])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "Adagrad": adagrad, "Adam": adam, "Momentum": momentum}
ORACLES = {(DOMAIN, op): training_oracle(op) for op in CASES}
