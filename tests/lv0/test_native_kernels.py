"""What the registry-driven parity test cannot see about the native Conv and pooling kernels:
non-contiguous and large inputs, the kernels' own chunking, errors, and what Conv keeps for
backward. (tests/lv0/test_ops.py compares every case of these ops with numpy.)"""

from __future__ import annotations

import numpy as np
import pytest
import threadpoolctl

from meta.lv0 import Context, native
from meta.ops.average_pool import AveragePool, NativeAveragePool
from meta.ops.conv import Conv, NativeConv
from meta.ops.max_pool import MaxPool, NativeMaxPool

from .test_ops import assert_close

pytestmark = pytest.mark.skipif(not native.available(), reason="meta._native is not built")


def both(numpy_cls, native_cls, attrs, inputs, dtype=np.float32):
    """Forward and backward of both implementations: ((outputs, grads) numpy, native)."""
    results = []
    for cls in (numpy_cls, native_cls):
        ctx = Context()
        outs = cls(**attrs).apply(ctx, *inputs)
        rng = np.random.default_rng(5)
        dys = [rng.standard_normal(y.shape).astype(dtype) if y.dtype.kind == "f" else None
               for y in outs]
        results.append((outs, cls(**attrs).backward(ctx, *dys), ctx))
    return results


def assert_parity(numpy_cls, native_cls, attrs, inputs, dtype=np.float32):
    (outs_np, grads_np, _), (outs, grads, ctx) = both(numpy_cls, native_cls, attrs, inputs, dtype)
    for i, (a, b) in enumerate(zip(outs, outs_np)):
        assert_close(a, b, dtype, f"{native_cls.__name__} output {i}")
    for i, (a, b) in enumerate(zip(grads, grads_np)):
        assert (a is None) == (b is None)
        if a is not None:
            assert_close(a, b, dtype, f"{native_cls.__name__} gradient {i}")
    return ctx


def test_conv_noncontiguous_inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6, 3, 4), dtype=np.float32).transpose(3, 1, 0, 2)  # (4,6,5,3)
    w = rng.standard_normal((4, 2, 2, 6), dtype=np.float32).transpose(0, 3, 1, 2)[:, ::2]
    assert not x.flags.c_contiguous and not w.flags.c_contiguous
    ctx = assert_parity(Conv, NativeConv, {"group": 2, "pads": [1, 0, 0, 1]},
                        [x, w, rng.standard_normal(8, dtype=np.float32)[::2]])
    assert ctx.native


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_large_and_every_chunking(dtype):
    """A LeNet-sized layer (several images per GEMM by default), and the kernel forced to one,
    three (a short last chunk) and all images per GEMM, against numpy."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 6, 14, 14)).astype(dtype)
    w = rng.standard_normal((16, 6, 5, 5)).astype(dtype)
    b = rng.standard_normal(16).astype(dtype)
    attrs = {"pads": [2, 1, 1, 2], "strides": [1, 2]}
    ctx = assert_parity(Conv, NativeConv, attrs, [x, w, b], dtype)
    (y_np, grads_np, _), _ = both(Conv, NativeConv, attrs, [x, w, b], dtype)
    dy = np.random.default_rng(5).standard_normal(y_np[0].shape).astype(dtype)
    geometry = {"group": 1, "strides": ctx.win.strides, "dilations": ctx.win.dilations,
                "pads": ctx.win.pads_begin, "out": ctx.win.out_shape}
    kernels = native.module()
    for images in (1, 3, 7):
        y = kernels.conv_forward(x, w, b, images_per_gemm=images, **geometry)
        assert_close(y, y_np[0], dtype, f"forward, {images} images per GEMM")
        grads = kernels.conv_backward(x, w, dy, images_per_gemm=images, **geometry)
        for i, (a, e) in enumerate(zip(grads, grads_np)):
            assert_close(a, e, dtype, f"gradient {i}, {images} images per GEMM")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_conv_and_gemm_split_over_threads_agree(threads):
    """With several OpenMP threads the batch is cut into one image range per thread (partial
    dW added up at the end) and large products into column blocks; one thread does neither.
    Every split gives numpy's result, and the BLAS's thread count is left as it was."""
    from meta.common.threads import set_threads
    from meta.ops.gemm import Gemm, NativeGemm

    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, 8, 12, 12), dtype=np.float32)  # odd batch: uneven ranges
    w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    a = rng.standard_normal((64, 200), dtype=np.float32)
    m = rng.standard_normal((300, 200), dtype=np.float32)

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info()
                if p["user_api"] == "blas"]

    previous = native.module().max_threads()
    set_threads(threads)
    try:
        before = blas_threads()
        assert_parity(Conv, NativeConv, {"pads": [1, 1, 1, 1]}, [x, w, b])
        assert_parity(Gemm, NativeGemm, {"transB": 1}, [a, m, b[:1].repeat(300)])
        assert blas_threads() == before
    finally:
        set_threads(previous)


def test_conv_keeps_no_columns():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 8, 8)), rng.standard_normal((4, 3, 3, 3))
    ctx = Context()
    NativeConv(pads=[1, 1, 1, 1]).apply(ctx, x, w)
    arrays = {k for k, v in vars(ctx).items() if isinstance(v, np.ndarray)}
    assert arrays == {"x", "w"}
    assert ctx.x is x and ctx.w is w  # contiguous inputs are kept, not copied
    numpy_ctx = Context()
    Conv(pads=[1, 1, 1, 1]).apply(numpy_ctx, x, w)
    assert hasattr(numpy_ctx, "cols")


@pytest.mark.parametrize("inputs", [
    lambda r: [r((1, 2, 5)), r((3, 2, 2))],  # 1-D
    lambda r: [r((1, 2, 5, 5)).astype(np.float32), r((3, 2, 2, 2))],  # mixed dtypes
    lambda r: [r((1, 2, 5, 5)).astype(np.float16), r((3, 2, 2, 2)).astype(np.float16)],
], ids=["1d", "mixed-dtypes", "float16"])
def test_conv_falls_back_to_numpy(inputs):
    args = inputs(np.random.default_rng(3).standard_normal)
    ctx = Context()
    y = NativeConv().apply(ctx, *args)[0]
    np.testing.assert_array_equal(y, Conv().apply(Context(), *args)[0])
    assert not getattr(ctx, "native", False) and hasattr(ctx, "cols")
    assert NativeConv().backward(ctx, np.ones_like(y))[0].shape == args[0].shape


def test_conv_wrong_shapes_name_the_op_and_shapes():
    x, w = np.zeros((2, 3, 5, 5), np.float32), np.zeros((4, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"Conv: X \[2, 3, 5, 5\] has 3 channels but W "
                                         r"\[4, 2, 3, 3\]"):
        NativeConv().apply(Context(), x, w)
    with pytest.raises(ValueError, match=r"Conv: B \[3\] must be \(4,\)"):
        NativeConv().apply(Context(), x, np.zeros((4, 3, 3, 3), np.float32),
                           np.zeros(3, np.float32))
    kernels, w = native.module(), np.zeros((4, 3, 3, 3), np.float32)
    geometry = {"group": 1, "strides": (1, 1), "dilations": (1, 1), "pads": (0, 0),
                "out": (3, 3)}
    with pytest.raises(ValueError, match=r"conv_backward: dY \(2, 4, 2, 3\) must be "
                                         r"\(2, 4, 3, 3\) for X \(2, 3, 5, 5\)"):
        kernels.conv_backward(x, w, np.zeros((2, 4, 2, 3), np.float32), **geometry)
    with pytest.raises(ValueError, match=r"conv_forward: X \(2, 3, 5, 5\) and W "
                                         r"\(4, 3, 3, 3\) do not agree with group=2"):
        kernels.conv_forward(x, w, None, **{**geometry, "group": 2})


def test_pools_noncontiguous_and_large():
    """(8, 64, 24, 24) is the wide CNN's pool input: past the OpenMP threshold."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((24, 8, 64, 24), dtype=np.float32).transpose(1, 2, 0, 3)
    assert not x.flags.c_contiguous
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]}
    ctx = assert_parity(MaxPool, NativeMaxPool, pool, [x])
    assert ctx.native
    overlapping = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                   "ceil_mode": 1}
    assert_parity(MaxPool, NativeMaxPool, overlapping, [x])
    for count_include_pad in (0, 1):
        assert_parity(AveragePool, NativeAveragePool,
                      {**overlapping, "count_include_pad": count_include_pad}, [x])


def test_max_pool_ties_infinities_nan_and_all_padding_windows_as_numpy():
    """Ties go to the first max in window order; -inf inputs and NaN behave as in numpy; a
    window wholly in padding gets -inf, index plane * H * W - 1, and passes nothing back."""
    x = np.array([[[[1.0, 1.0, -np.inf], [1.0, np.nan, 0.0], [-np.inf, -np.inf, 2.0]]]])
    x = np.concatenate([x, -x], axis=1)
    for attrs in ({"kernel_shape": [2, 2]},
                  {"kernel_shape": [2, 2], "pads": [2, 2, 0, 0], "storage_order": 1},
                  {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}):
        (outs_np, grads_np, _), (outs, grads, _) = both(MaxPool, NativeMaxPool, attrs, [x],
                                                        np.float64)
        np.testing.assert_array_equal(outs[0], outs_np[0], err_msg=str(attrs))
        np.testing.assert_array_equal(outs[1], outs_np[1], err_msg=str(attrs))
        np.testing.assert_array_equal(grads[0], grads_np[0], err_msg=str(attrs))


def test_pools_fall_back_and_check_shapes():
    x = np.arange(2 * 2 * 7, dtype=np.float64).reshape(2, 2, 7)  # 1-D
    ctx = Context()
    y, index = NativeMaxPool(kernel_shape=[3]).apply(ctx, x)
    assert not getattr(ctx, "native", False)
    np.testing.assert_array_equal(index, MaxPool(kernel_shape=[3]).apply(Context(), x)[1])
    with pytest.raises(ValueError, match=r"MaxPool: the kernel_shape attribute is required "
                                         r"\(X \[2, 2, 7\]\)"):
        NativeMaxPool().apply(Context(), x)
    with pytest.raises(ValueError, match=r"AveragePool: kernel \[2, 2\] has 2 dimensions"):
        NativeAveragePool(kernel_shape=[2, 2]).apply(Context(), x)
    ctx = Context()
    NativeAveragePool(kernel_shape=[2, 2]).apply(ctx, np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match=r"average_pool_backward: dY \(1, 1, 2, 3\) must be "
                                         r"\(1, 1, 3, 3\) for X \(1, 1, 4, 4\)"):
        NativeAveragePool(kernel_shape=[2, 2]).backward(ctx, np.zeros((1, 1, 2, 3)))
