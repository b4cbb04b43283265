"""BatchNormalization opsets 6-13 and Dropout opsets 6-11, where onnx.reference cannot be the
oracle (it blends statistics at opset 9, trains opset 6-8 nodes, ignores ``spatial``): each is
checked against the opset-14/12 operator or a numpy formula, and through the executor."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from meta.lv0 import Context, check_gradients, native
from meta.lv1 import ReferenceExecutor, from_onnx
from meta.ops.batch_normalization import (
    BatchNormalization,
    BatchNormalization6,
    BatchNormalization7,
    BatchNormalization9,
    NativeBatchNormalization6,
    NativeBatchNormalization9,
)
from meta.ops.dropout import Dropout6, Dropout7, Dropout10


def _bn_inputs(rng, shape, stats_shape=None):
    stats_shape = stats_shape or (shape[1],)
    return [rng.standard_normal(shape), rng.standard_normal(stats_shape),
            rng.standard_normal(stats_shape), rng.standard_normal(stats_shape),
            rng.uniform(0.5, 2.0, stats_shape)]


@pytest.mark.parametrize("cls,attrs", [(BatchNormalization9, {}), (BatchNormalization7, {}),
                                       (BatchNormalization6, {"is_test": 1})])
def test_legacy_batchnorm_infers_as_opset_14(cls, attrs):
    inputs = _bn_inputs(np.random.default_rng(0), (3, 2, 4))
    (y,) = cls(epsilon=0.01, **attrs).apply(Context(), *inputs)
    (want,) = BatchNormalization(epsilon=0.01).apply(Context(), *inputs)
    np.testing.assert_array_equal(y, want)


def test_legacy_batchnorm_training_outputs_and_gradients():
    """Five outputs in training: Y, running mean and variance, the batch mean and variance;
    gradients through all five against central differences."""
    inputs = _bn_inputs(np.random.default_rng(1), (4, 3, 2))
    op = BatchNormalization9(momentum=0.75)
    op.n_outputs = 5
    y, rm, rv, sm, sv = op.apply(Context(training=True), *inputs)
    want = BatchNormalization(momentum=0.75, training_mode=1).apply(Context(), *inputs)
    for got, expected in zip((y, rm, rv), want):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(sm, inputs[0].mean(axis=(0, 2)), rtol=1e-12)
    np.testing.assert_allclose(sv, inputs[0].var(axis=(0, 2)), rtol=1e-12)
    # As written (opset 6, is_test=0) the node trains, so the gradient check sees training.
    op6 = BatchNormalization6(momentum=0.75)
    op6.n_outputs = 5
    report = check_gradients(op6, inputs)
    assert report.passed, report
    # In inference the extra outputs hold the given statistics.
    out = op.apply(Context(), *inputs)
    assert len(out) == 5 and out[1] is inputs[3] and out[4] is inputs[4]


def test_spatial_0_keeps_per_element_statistics():
    rng = np.random.default_rng(2)
    x, scale, b, mean, var = _bn_inputs(rng, (5, 3, 2), (3, 2))
    (y,) = BatchNormalization7(spatial=0, epsilon=0.01).apply(Context(), x, scale, b, mean, var)
    np.testing.assert_allclose(y, scale * (x - mean) / np.sqrt(var + 0.01) + b, rtol=1e-12)
    (y,) = BatchNormalization6(spatial=0, epsilon=0.01).apply(Context(), x, scale, b, mean, var)
    m, v = x.mean(axis=0), x.var(axis=0)
    np.testing.assert_allclose(y, scale * (x - m) / np.sqrt(v + 0.01) + b, rtol=1e-12)
    op = BatchNormalization6(spatial=0)
    op.n_outputs = 5
    assert check_gradients(op, [x, scale, b, mean, var]).passed
    with pytest.raises(ValueError, match="spatial=0"):
        BatchNormalization7(spatial=0).apply(Context(), x, scale[0], b[0], mean[0], var[0])


@pytest.mark.skipif(not native.available(), reason="the native extension is not built")
def test_native_legacy_batchnorm_matches_numpy():
    rng = np.random.default_rng(3)
    for shape, stats in (((4, 3, 2), None), ((4, 3, 2), (3, 2))):
        inputs = [v.astype(np.float32) for v in _bn_inputs(rng, shape, stats)]
        spatial = {"spatial": 0} if stats else {}
        for training in (True, False):
            ops_ = [NativeBatchNormalization6(**spatial), BatchNormalization6(**spatial)]
            ctxs = [Context(training=training), Context(training=training)]
            outs = []
            for op, ctx in zip(ops_, ctxs):
                op.n_outputs = 5
                outs.append(op.apply(ctx, *inputs))
            for a, b in zip(*outs):
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
            dy = [np.ones_like(o) for o in outs[1]]
            for a, b in zip(ops_[0].backward(ctxs[0], *dy), ops_[1].backward(ctxs[1], *dy)):
                assert (a is None) == (b is None)
                if a is not None:
                    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)
    inputs = [v.astype(np.float32) for v in _bn_inputs(rng, (4, 3, 2))]
    np.testing.assert_allclose(NativeBatchNormalization9().apply(Context(), *inputs)[0],
                               BatchNormalization9().apply(Context(), *inputs)[0], rtol=2e-5)


def _bn_model(opset, attrs, n_outputs=1):
    outs = ["y", "rm", "rv", "sm", "sv"][:n_outputs]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs, **attrs)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [3], v) for n, v in
             (("s", [1.0, 2.0, 0.5]), ("b", [0.0, 1.0, -1.0]), ("m", [0.1, 0.2, 0.3]),
              ("v", [1.0, 1.5, 2.0]))]
    graph = helper.make_graph([node], "bn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [4, 3, 2])], [helper.make_tensor_value_info(
            o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset,attrs,n", [(9, {}, 1), (9, {"momentum": 0.5}, 5),
                                           (7, {"spatial": 1}, 1), (6, {"is_test": 1}, 1)])
def test_executor_trains_legacy_batchnorm_state_as_opset_14(opset, attrs, n):
    x = np.random.default_rng(4).standard_normal((4, 3, 2)).astype(np.float32)
    old, new = from_onnx(_bn_model(opset, attrs, n)), from_onnx(_bn_model(15, attrs.get(
        "momentum") and {"momentum": attrs["momentum"]} or {}))
    assert set(old.state) == {"m", "v"} and set(old.parameters) == {"s", "b"}
    for graph in (old, new):
        ex = ReferenceExecutor(graph).train()
        ex.inference({"x": x}, ["y"])
    for name in ("m", "v"):
        np.testing.assert_allclose(old.initializers[name], new.initializers[name], rtol=1e-6)
    ex = ReferenceExecutor(old).eval()
    np.testing.assert_allclose(ex.inference({"x": x}, ["y"])["y"],
                               ReferenceExecutor(new).eval().inference({"x": x}, ["y"])["y"],
                               rtol=1e-6)


def test_legacy_dropout():
    x = np.random.default_rng(5).standard_normal((50, 40)).astype(np.float32)
    for op, mask_dtype in ((Dropout10(ratio=0.3), np.bool_), (Dropout7(), np.float32),
                           (Dropout6(is_test=1), np.float32)):
        y, mask = op.apply(Context(), x)
        assert y is x and mask.dtype == mask_dtype and mask.all()
        y, mask = op.apply(Context(training=True), x)
        kept = mask.astype(bool)
        assert 0.4 < kept.mean() < 0.9
        np.testing.assert_allclose(y[kept], x[kept] / (1 - op.ratio), rtol=1e-6)
        assert not y[~kept].any()
    # opset 6 with the default is_test=0 drops as written
    y, _ = Dropout6().apply(Context(), x)
    assert (y == 0).any()
    assert Dropout6.inference_form({"ratio": 0.5}, ["x"], ["y"])[0]["is_test"] == 1
