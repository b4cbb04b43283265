"""Registry-driven operator tests: every registered implementation, every case.

Forward is checked against ONNX's reference evaluator, backward against float64 central
differences, and native twins against their numpy implementation.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from meta.lv0 import Context, InferenceContext, Operator, check_gradients, entries, native

from . import control_harness
from .cases import CASES, cases_for
from .cases_control import Scoped
from .cases_sequence import SEQUENCE_GRAD_OPS, SEQUENCE_OPS
from .cases_tensor import mean_squared_error
from .cases_training import ORACLES as TRAINING_ORACLES
from .control_harness import value_info

ENTRIES = list(entries())
ENTRY_IDS = [e.name for e in ENTRIES]


NEWEST_OPSET = 21


def _serving_opset(entry) -> int:
    """The newest opset this implementation serves (the next version's ``since`` - 1)."""
    later = [e.since for e in ENTRIES
             if (e.domain, e.op_type) == (entry.domain, entry.op_type) and e.since > entry.since]
    return min(later) - 1 if later else max(NEWEST_OPSET, entry.since)


def _attribute(value):
    return numpy_helper.from_array(value) if isinstance(value, np.ndarray) else value


def assert_same(a, b, msg: str) -> None:
    """Arrays to 1e-10, sequences item by item."""
    if isinstance(a, list) or isinstance(b, list):
        assert isinstance(a, list) and isinstance(b, list) and len(a) == len(b), msg
        for x, y in zip(a, b):
            assert_same(x, y, msg)
        return
    assert np.shape(a) == np.shape(b), f"{msg}: shapes {np.shape(a)} vs {np.shape(b)}"
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12, err_msg=msg)


def _oracle(op_type: str, attrs: dict, inputs: list, opset: int, n_outputs: int) -> list:
    """Run one node through onnx.reference; ``None`` inputs become omitted optional inputs."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs,
                            **{k: _attribute(v) for k, v in attrs.items() if v is not None})
    given = [(n, x) for n, x in zip(names, inputs) if x is not None]
    graph = helper.make_graph(
        [node], "oracle",
        [value_info(n, x) for n, x in given],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(given))


def test_every_registered_op_has_cases():
    missing = sorted({e.op_type for e in ENTRIES} - set(CASES))
    assert not missing, f"registered operators without test cases in tests/lv0/cases.py: {missing}"


@pytest.mark.parametrize("entry", ENTRIES, ids=ENTRY_IDS)
def test_gradients(entry):
    if entry.backend == "native" and not native.available():
        pytest.fail("the native extension is not built", pytrace=False)
    cases = cases_for(entry.op_type, opset=_serving_opset(entry))
    assert cases, f"{entry.name}: no test case is valid at opset {_serving_opset(entry)}"
    if entry.op_type in SEQUENCE_OPS:  # forward only, but Tensor.split's two ops
        has_backward = entry.cls.backward is not Operator.backward
        assert has_backward == (entry.op_type in SEQUENCE_GRAD_OPS), \
            f"{entry.name}: backward {'defined' if has_backward else 'missing'}"
        return
    for attrs, inputs in cases:
        if isinstance(attrs, Scoped):  # control flow: needs the executor's scope
            problems = control_harness.check_gradients(entry.op_type, attrs, inputs,
                                                       _serving_opset(entry))
            assert not problems, "\n".join(problems)
            continue
        report = check_gradients(entry.cls(**attrs), inputs)
        assert report.passed, f"{attrs}\n{report}"


ONNX_ENTRIES = [e for e in ENTRIES if e.backend == "numpy" and e.domain == ""]


@pytest.mark.parametrize("entry", ONNX_ENTRIES, ids=[e.name for e in ONNX_ENTRIES])
def test_forward_matches_onnx_reference(entry):
    """ONNX-domain operators against onnx.reference at the newest opset they serve."""
    opset = _serving_opset(entry)
    for attrs, inputs in cases_for(entry.op_type, seed=1, opset=opset):
        if isinstance(attrs, Scoped):  # control flow, as a one-node model with its scope
            ours, theirs = control_harness.forward(entry.op_type, attrs, inputs, opset)
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                assert_same(a, b, f"{entry.op_type} {attrs} output {i}")
            continue
        # (an InferenceContext for sequences: Context.apply records np.shape of each input)
        ctx = InferenceContext() if entry.op_type in SEQUENCE_OPS else Context()
        ours = entry.cls(**attrs).apply(ctx, *inputs)
        # Where onnx.reference is wrong, a case's attrs say how many outputs to trust
        # (cases_nn.OracleLimit, with the reason).
        checked = getattr(attrs, "oracle_outputs", len(ours))
        if checked == 0:
            continue
        theirs = _oracle(entry.op_type, dict(attrs), inputs, opset, len(ours))
        for i, (a, b) in enumerate(zip(ours[:checked], theirs)):
            assert_same(a, b, f"{entry.op_type} {attrs} output {i}")


# onnx.reference knows only the ONNX domain: other domains' operators are checked against a
# numpy function of (*inputs, **attrs) returning the output(s).
ORACLES = {("ai.meta", "MeanSquaredError"): mean_squared_error, **TRAINING_ORACLES}
CUSTOM_ENTRIES = [e for e in ENTRIES if e.backend == "numpy" and e.domain != ""]


@pytest.mark.parametrize("entry", CUSTOM_ENTRIES, ids=[e.name for e in CUSTOM_ENTRIES])
def test_forward_matches_custom_oracle(entry):
    oracle = ORACLES.get((entry.domain, entry.op_type))
    assert oracle, f"{entry.name}: no oracle in ORACLES (tests/lv0/test_ops.py)"
    for attrs, inputs in cases_for(entry.op_type, seed=1):
        ours = entry.cls(**attrs).apply(Context(), *inputs)
        theirs = oracle(*inputs, **attrs)
        for i, (a, b) in enumerate(zip(ours, theirs if isinstance(theirs, tuple) else (theirs,))):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12,
                                       err_msg=f"{entry.op_type} {attrs} output {i}")


def _twins():
    impls = {}
    for e in ENTRIES:
        impls.setdefault((e.domain, e.op_type, e.since), {})[e.backend] = e.cls
    return [(key, b) for key, b in impls.items() if "native" in b and "numpy" in b]


# A native kernel may sum in another order than numpy (BLAS blocking, OpenMP partial sums):
# it must agree to a few units in the last place of its dtype, relative to the output's scale.
PARITY_RTOL = {np.float32: 2e-5, np.float64: 1e-12}


def assert_close(got, expected, dtype, what):
    assert got.dtype == expected.dtype and got.shape == expected.shape, what
    scale = float(np.abs(expected).max(initial=1.0))
    np.testing.assert_allclose(got, expected, rtol=PARITY_RTOL[dtype],
                               atol=PARITY_RTOL[dtype] * scale, err_msg=what)


@pytest.mark.parametrize("key,impls", _twins(), ids=[k[1] for k, _ in _twins()])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_matches_numpy(key, impls, dtype):
    entry = next(e for e in ENTRIES if (e.domain, e.op_type, e.since) == key)
    cases = cases_for(key[1], seed=2, opset=_serving_opset(entry))
    assert cases, f"{key[1]} has a native twin but no test case"
    for attrs, inputs in cases:
        xs = [x.astype(dtype) if x is not None and x.dtype.kind == "f" else x for x in inputs]
        ctx_np, ctx_nat = Context(), Context()
        expected = impls["numpy"](**attrs).apply(ctx_np, *xs)
        got = impls["native"](**attrs).apply(ctx_nat, *xs)
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_close(a, b, dtype, f"{key[1]} {attrs} output {i}")
        grads = [np.random.default_rng(3).standard_normal(y.shape).astype(y.dtype)
                 if y.dtype.kind == "f" else None for y in expected]
        for i, (a, b) in enumerate(zip(impls["native"](**attrs).backward(ctx_nat, *grads),
                                       impls["numpy"](**attrs).backward(ctx_np, *grads))):
            assert (a is None) == (b is None), f"{key[1]} {attrs} gradient {i}"
            if a is not None:
                assert_close(a, b, dtype, f"{key[1]} {attrs} gradient {i}")


def test_native_relu_large_noncontiguous_and_nan():
    from meta.ops.relu import NativeRelu, Relu

    x = np.random.default_rng(0).standard_normal((700, 400)).astype(np.float32).T  # > 2**18
    x[0, 0] = np.nan
    np.testing.assert_array_equal(NativeRelu().apply(Context(), x)[0],
                                  Relu().apply(Context(), x)[0])


def test_native_twin_hands_other_dtypes_to_numpy_and_the_kernel_refuses_them():
    from meta.lv0 import native
    from meta.ops.relu import NativeRelu

    (y,) = NativeRelu().apply(Context(), np.arange(-2, 2))
    assert y.dtype == np.int64 and y.tolist() == [0, 0, 0, 1]
    with pytest.raises(TypeError, match="int64"):
        native.call("relu_forward", np.arange(4))
