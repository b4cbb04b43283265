"""Test cases for every registered operator type: (attributes, inputs) built from a seeded rng.

The registry-driven tests fail for an operator type that has no entry here.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

Case = tuple[dict[str, Any], list[np.ndarray | None]]
# A case may carry a third element, the opsets it is valid at (``range(13, 22)``), for operators
# whose attributes became inputs in some version; ``cases_for(..., opset=)`` keeps the valid ones.


def _away_from_zero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values with |x| >= 0.1, so finite differences never straddle a kink at 0."""
    x = rng.uniform(0.1, 2.0, shape)
    return x * rng.choice([-1.0, 1.0], shape)


def gemm(rng: np.random.Generator) -> list[Case]:
    cases = []
    for trans_a in (0, 1):
        for trans_b in (0, 1):
            a = rng.standard_normal((4, 3) if trans_a else (3, 4))
            b = rng.standard_normal((5, 4) if trans_b else (4, 5))
            attrs = {"transA": trans_a, "transB": trans_b, "alpha": 0.5, "beta": 1.25}
            cases.append((attrs, [a, b, rng.standard_normal(5)]))
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    cases += [({}, [a, b], range(11, 100)),  # C optional from opset 11
              ({}, [a, b, rng.standard_normal((3, 1))]),
              ({}, [a, b, rng.standard_normal((3, 5))]), ({}, [a, b, rng.standard_normal(1)])]
    # opset 6: C broadcasts only with broadcast=1
    new = [c if len(c) == 3 else (*c, range(7, 100)) for c in cases]
    return new + [({}, [a, b, rng.standard_normal((3, 5))], range(6, 7)),
                  ({"broadcast": 1, "transB": 1},
                   [a, rng.standard_normal((5, 4)), rng.standard_normal(5)], range(6, 7))]


def relu(rng: np.random.Generator) -> list[Case]:
    return [({}, [_away_from_zero(rng, (3, 4))]), ({}, [_away_from_zero(rng, (2, 3, 2))])]


def flatten(rng: np.random.Generator) -> list[Case]:
    x = rng.standard_normal((2, 3, 4))
    return [({"axis": axis}, [x]) for axis in (0, 1, 2, 3, -1)]


def reshape(rng: np.random.Generator) -> list[Case]:
    x = rng.standard_normal((2, 3, 4))
    return [({}, [x, np.array(s, dtype=np.int64)]) for s in ([6, 4], [0, -1], [-1], [2, 0, 2, 2])]


def softmax_cross_entropy_loss(rng: np.random.Generator) -> list[Case]:
    scores, labels = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    scores3, labels3 = rng.standard_normal((3, 4, 2)), rng.integers(0, 4, (3, 2))
    weights = rng.uniform(0.5, 2.0, 4)
    ignored = labels.copy()
    ignored[1] = -1
    cases: list[Case] = []
    for reduction in ("mean", "sum", "none"):
        cases.append(({"reduction": reduction}, [scores, labels]))
        cases.append(({"reduction": reduction}, [scores, labels, weights]))
        cases.append(({"reduction": reduction, "ignore_index": -1}, [scores, ignored, weights]))
        cases.append(({"reduction": reduction}, [scores3, labels3]))
    cases.append(({"ignore_index": -1}, [scores, ignored]))
    return cases


CASES: dict[str, Callable[[np.random.Generator], list[Case]]] = {
    "Gemm": gemm,
    "Relu": relu,
    "Flatten": flatten,
    "Reshape": reshape,
    "SoftmaxCrossEntropyLoss": softmax_cross_entropy_loss,
}


def cases_for(op_type: str, seed: int = 0, opset: int | None = None) -> list[Case]:
    cases = CASES[op_type](np.random.default_rng(seed))
    return [c[:2] for c in cases if opset is None or len(c) < 3 or opset in c[2]]


# Cases of the wider operator library live beside this file, one module per family, and join
# the table here so every registry-driven test sees them.
from .cases_attention import CASES as _ATTENTION_CASES  # noqa: E402
from .cases_control import CASES as _CONTROL_CASES  # noqa: E402
from .cases_index import CASES as _INDEX_CASES  # noqa: E402
from .cases_math import CASES as _MATH_CASES  # noqa: E402
from .cases_nn import CASES as _NN_CASES  # noqa: E402
from .cases_nn_extra import CASES as _NN_EXTRA_CASES  # noqa: E402
from .cases_quant import CASES as _QUANT_CASES  # noqa: E402
from .cases_recurrent import CASES as _RECURRENT_CASES  # noqa: E402
from .cases_resample import CASES as _RESAMPLE_CASES  # noqa: E402
from .cases_sequence import CASES as _SEQUENCE_CASES  # noqa: E402
from .cases_tensor import CASES as _TENSOR_CASES  # noqa: E402
from .cases_training import CASES as _TRAINING_CASES  # noqa: E402

for _family in (_NN_CASES, _TENSOR_CASES, _MATH_CASES, _INDEX_CASES,
                _NN_EXTRA_CASES, _RECURRENT_CASES, _RESAMPLE_CASES, _CONTROL_CASES,
                _ATTENTION_CASES, _QUANT_CASES, _TRAINING_CASES, _SEQUENCE_CASES):
    _overlap = set(_family) & set(CASES)
    assert not _overlap, f"operator cases defined twice: {sorted(_overlap)}"
    CASES.update(_family)
