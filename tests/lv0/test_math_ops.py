"""Checks of new operators that onnx.reference cannot make at float64 precision."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meta.lv0 import Context
from meta.ops._special import erf, erfc
from meta.ops.gelu import Gelu


def test_erf_matches_math_erf_to_a_few_ulp():
    x = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 3.0, -3.0, np.inf, -np.inf]])
    expected = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(erf(x), expected, rtol=4e-15, atol=0)
    assert np.isnan(erf(np.array([np.nan])))[0]
    expected = np.array([math.erfc(v) for v in x])
    np.testing.assert_allclose(erfc(x), expected, rtol=1e-11, atol=0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_its_float64_formula(approximate):
    x = np.linspace(-6, 6, 101)
    if approximate == "none":
        expected = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x])
    else:
        expected = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    got = Gelu(approximate=approximate).apply(Context(), x)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)
    got32 = Gelu(approximate=approximate).apply(Context(), x.astype(np.float32))[0]
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-6, atol=1e-7)


def test_gelu_rejects_an_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        Gelu(approximate="sigmoid").apply(Context(), np.ones(2))


def test_group_normalization_21_matches_onnx_reference_in_float32():
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from meta.ops.group_normalization import GroupNormalization

    rng = np.random.default_rng(0)
    x, s, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((2, 4, 3), (4,), (4,)))
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "xsb"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    expected = ReferenceEvaluator(model).run(None, {"x": x, "s": s, "b": b})[0]
    got = GroupNormalization(num_groups=2).apply(Context(), x, s, b)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_rms_normalization_matches_its_float64_formula():
    from meta.ops.rms_normalization import RMSNormalization

    x, scale = np.random.default_rng(1).standard_normal((2, 3, 4)), np.linspace(0.5, 2, 4)
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-5)) * scale
    got = RMSNormalization().apply(Context(), x, scale)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-13)


@pytest.mark.parametrize("op,formula", [
    ("HannWindow", lambda a: 0.5 - 0.5 * np.cos(a)),
    ("HammingWindow", lambda a: 25 / 46 - 21 / 46 * np.cos(a)),
    ("BlackmanWindow", lambda a: 0.42 - 0.5 * np.cos(a) + 0.08 * np.cos(2 * a))])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_match_their_definition(op, formula, periodic):
    from meta.lv0 import lookup

    n = 7
    y = lookup(op, 21)(periodic=periodic, output_datatype=11).apply(Context(), np.array(n))[0]
    a = 2 * np.pi * np.arange(n) / (n if periodic else n - 1)
    np.testing.assert_allclose(y, formula(a), rtol=1e-14, atol=1e-15)


def test_opset6_broadcast_aligns_b_at_axis_and_refuses_unequal_shapes_without_it():
    from meta.ops.add import Add6
    from meta.ops.gemm import Gemm6

    a, b = np.arange(24.0).reshape(2, 3, 4), np.array([10.0, 20.0, 30.0])
    y = Add6(broadcast=1, axis=1).apply(Context(), a, b)[0]
    np.testing.assert_array_equal(y, a + b[:, None])
    with pytest.raises(ValueError, match="one shape without broadcast=1"):
        Add6().apply(Context(), a, b)
    with pytest.raises(ValueError, match="without broadcast=1"):
        Gemm6().apply(Context(), np.ones((2, 3)), np.ones((3, 4)), np.ones(4))
    np.testing.assert_array_equal(
        Gemm6(broadcast=1).apply(Context(), np.ones((2, 3)), np.ones((3, 4)), np.ones(4))[0],
        np.full((2, 4), 4.0))
