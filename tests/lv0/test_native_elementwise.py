"""Native twins of the elementwise, activation, softmax and BatchNormalization operators: what
the registry-driven parity test (test_ops.py) cannot see. Non-contiguous inputs, tensors above
the OpenMP threshold (2^18 elements), NaN/inf handled as numpy does, and clear errors for bad
shapes; the kernels' (N, C, d...) softmax cross-entropy layout, which the operator leaves to
numpy, is checked against numpy here."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import Context, lookup, native

pytestmark = pytest.mark.skipif(not native.available(), reason="native extension not built")

BIG = (64, 32, 12, 12)  # 294912 elements > 2^18: the kernels go parallel


def both(op_type, inputs, opset=21, grads=None, **attrs):
    """(native, numpy) outputs and input gradients of one op on the same inputs."""
    results = []
    for backend in ("native", "numpy"):
        cls = lookup(op_type, opset, backends=(backend,))
        assert cls.backend == backend
        op, ctx = cls(**attrs), Context()
        outs = op.apply(ctx, *inputs)
        g = grads or [np.random.default_rng(5).standard_normal(y.shape).astype(y.dtype)
                      for y in outs[:1]]
        results.append((outs, op.backward(ctx, *g)))
    return results


def assert_same(got, expected, rtol):
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and a.dtype == b.dtype
            scale = float(np.nanmax(np.abs(b), initial=1.0)) if np.isfinite(b).any() else 1.0
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * scale)


def check(op_type, inputs, rtol=1e-5, **attrs):
    (out_n, grad_n), (out_p, grad_p) = both(op_type, inputs, **attrs)
    assert_same(out_n, out_p, rtol)
    assert_same(grad_n, grad_p, rtol)


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [(BIG, (1, 32, 1, 1)), (BIG, (32, 1, 1)), ((32, 1, 1), BIG),
                                    (BIG, BIG), ((64, 1, 12, 1), (32, 1, 12))])
def test_binary_large_broadcasts(op_type, shapes):
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(0.5, 2, s).astype(np.float32) for s in shapes)
    check(op_type, [a, b], rtol=1e-4)  # sums over ~3e5 values in another order


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
def test_binary_noncontiguous_and_scalars(op_type):
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 2, (6, 5)).T  # Fortran order
    b = rng.uniform(0.5, 2, (5, 12))[:, ::2]  # strided
    check(op_type, [a, b], rtol=1e-12)
    check(op_type, [a, np.float64(1.5)], rtol=1e-12)  # a numpy scalar
    check(op_type, [np.array(2.5), b], rtol=1e-12)  # a 0-d array


def test_binary_nan_and_inf_as_numpy():
    a = np.array([[np.inf, -np.inf, np.nan, 1.0, 0.0]], np.float32)
    b = np.array([[np.inf], [0.0]], np.float32)
    for op_type in ("Add", "Sub", "Mul", "Div"):
        with np.errstate(all="ignore"):
            (out_n, _), (out_p, _) = both(op_type, [a, b])
        np.testing.assert_array_equal(out_n[0], out_p[0])  # NaN where numpy has NaN


def test_binary_mixed_dtypes_and_ints_take_numpy():
    a, b = np.ones((2, 3), np.float32), np.ones(3, np.float64)
    (out_n, _), (out_p, _) = both("Add", [a, b])
    assert out_n[0].dtype == out_p[0].dtype == np.float64
    (out_n, _), _ = both("Div", [np.array([7, -7]), np.array([2, 2])], grads=[np.ones(2)])
    np.testing.assert_array_equal(out_n[0], [3, -3])  # C-style integer division


def test_binary_bad_shapes_name_the_op():
    op = lookup("Mul", 21, backends=("native",))()
    with pytest.raises(ValueError, match=r"Mul: cannot broadcast input shapes \(2, 3\), \(4,\)"):
        op.apply(Context(), np.ones((2, 3)), np.ones(4))
    with pytest.raises(ValueError,
                       match=r"unbroadcast_sum: cannot broadcast shapes \(2, 3\) and \(4, 3\)"):
        native.module().unbroadcast_sum(np.ones((2, 3)), (4, 3))


@pytest.mark.parametrize("op_type", ["Sigmoid", "Tanh", "LeakyRelu"])
def test_activations_large_noncontiguous_and_special_values(op_type):
    x = np.random.default_rng(2).standard_normal((700, 400)).astype(np.float32).T  # > 2^18
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, :2] = [100.0, -100.0]  # where a naive sigmoid overflows
    (out_n, grad_n), (out_p, grad_p) = both(op_type, [x])
    np.testing.assert_array_equal(np.isnan(out_n[0]), np.isnan(out_p[0]))
    np.testing.assert_allclose(out_n[0], out_p[0], rtol=3e-7, atol=1e-7)
    np.testing.assert_allclose(grad_n[0], grad_p[0], rtol=3e-7, atol=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_based_kernels_against_numpy(dtype):
    """The kernels' own exp and tanh (vectorised polynomials) over a wide range."""
    m = native.module()
    x = np.linspace(-100, 100, 300001).astype(dtype).reshape(1, -1)
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        sig = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    np.testing.assert_allclose(m.sigmoid_forward(x), sig, rtol=4 * np.finfo(dtype).eps,
                               atol=np.finfo(dtype).tiny)
    np.testing.assert_allclose(m.tanh_forward(x), np.tanh(x), rtol=4 * np.finfo(dtype).eps,
                               atol=4 * np.finfo(dtype).eps * 1e-30)
    assert np.isnan(m.sigmoid_forward(np.array([np.nan], dtype))).all()


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_kernels_any_axis_and_large(axis):
    m = native.module()
    x = np.random.default_rng(3).standard_normal((70, 64, 60))  # > 2^18
    dy = np.random.default_rng(4).standard_normal(x.shape)
    shifted = x - x.max(axis=axis, keepdims=True)
    lsm = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    np.testing.assert_allclose(m.log_softmax_forward(x, axis), lsm, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.softmax_forward(x, axis), np.exp(lsm), rtol=1e-12, atol=1e-14)
    y = np.exp(lsm)
    np.testing.assert_allclose(m.softmax_backward(y, dy, axis),
                               y * (dy - (dy * y).sum(axis=axis, keepdims=True)), atol=1e-12)
    np.testing.assert_allclose(m.log_softmax_backward(lsm, dy, axis),
                               dy - y * dy.sum(axis=axis, keepdims=True), atol=1e-12)


def test_softmax_nan_row_stays_nan():
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], np.float32)
    (out_n, _), (out_p, _) = both("Softmax", [x])
    np.testing.assert_array_equal(np.isnan(out_n[0]), np.isnan(out_p[0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_softmax_cross_entropy_kernel_spatial(reduction):
    """The (N, C, d...) layout of the kernels, against the numpy operator."""
    rng = np.random.default_rng(6)
    scores = rng.standard_normal((4, 5, 3, 7)).astype(np.float32)
    labels = rng.integers(0, 5, (4, 3, 7))
    numpy_op = lookup("SoftmaxCrossEntropyLoss", 21, backends=("numpy",))(reduction=reduction)
    ctx = Context()
    loss, logp = numpy_op.apply(ctx, scores, labels)
    dloss = np.asarray(rng.standard_normal(loss.shape), np.float32)
    dscores = numpy_op.backward(ctx, dloss)[0]
    m = native.module()
    got_loss, got_logp = m.softmax_cross_entropy_forward(scores, labels, reduction)
    np.testing.assert_allclose(got_loss, loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_logp, logp, rtol=1e-5, atol=1e-6)
    coeff = (dloss / labels.size if reduction == "mean" else dloss).reshape(-1)
    np.testing.assert_allclose(m.softmax_cross_entropy_backward(got_logp, labels, coeff),
                               dscores, rtol=1e-5, atol=1e-7)


def test_softmax_cross_entropy_bad_labels_give_numpy_errors():
    cls = lookup("SoftmaxCrossEntropyLoss", 21, backends=("native",))
    scores = np.zeros((3, 4), np.float32)
    with pytest.raises(IndexError, match=r"SoftmaxCrossEntropyLoss: targets must lie in \[0, 3\]"):
        cls().apply(Context(), scores, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="SoftmaxCrossEntropyLoss: target of shape"):
        cls().apply(Context(), scores, np.array([0, 1]))
    with pytest.raises(ValueError, match="unknown reduction"):
        cls(reduction="max").apply(Context(), scores, np.array([0, 1, 2]))


@pytest.mark.parametrize("training", [0, 1])
@pytest.mark.parametrize("shape", [BIG, (600, 512)])
def test_batchnorm_large_noncontiguous(training, shape):
    rng = np.random.default_rng(7)
    x = np.asfortranarray(rng.standard_normal(shape).astype(np.float32) * 3 + 10)
    c = shape[1]
    stats = [rng.standard_normal(c).astype(np.float32) for _ in range(3)]
    stats.append(rng.uniform(0.5, 2, c).astype(np.float32))
    grads = [rng.standard_normal(shape).astype(np.float32)] + (
        [None, None] if training else [])
    (out_n, grad_n), (out_p, grad_p) = both("BatchNormalization", [x, *stats], grads=grads,
                                            training_mode=training, momentum=0.9)
    assert_same(out_n, out_p, 1e-4)
    assert_same(grad_n, grad_p, 1e-3)  # float32 sums over 3e5 values, numpy's in float32


def test_batchnorm_bad_shapes_give_numpy_errors():
    cls = lookup("BatchNormalization", 21, backends=("native",))
    x, v = np.ones((2, 3, 4), np.float32), np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"BatchNormalization: scale \[4\] must be \(3,\)"):
        cls().apply(Context(), x, np.ones(4, np.float32), v, v, v)
    with pytest.raises(ValueError, match=r"must be \(None,\)"):
        cls().apply(Context(), np.ones(3, np.float32), v, v, v, v)
