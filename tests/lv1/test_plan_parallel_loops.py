"""The plan's own copy loops on its threads (issue 42, the bf16 transformer step at 2 threads):
Transpose as row copies (at more than one thread), copy / accumulate / fill and the float32
<-> bf16 conversion in chunks, and a column sum (a bias gradient) in fixed parts of rows.
Each must give numpy's result, the same bits at 1, 2 and 3 threads (the column sum's parts
are fixed by the shape, not the threads)."""

from __future__ import annotations

import ml_dtypes  # bf16 arrays, as the plan holds them
import numpy as np
import pytest

from meta.common.threads import set_threads
from meta.lv1.plan import runtime


def at_threads(run, counts=(1, 2, 3)):
    """``run()``'s result at each thread count."""
    rt = runtime.module()
    previous = rt.max_threads()
    out = []
    try:
        for threads in counts:
            set_threads(threads)
            assert rt.max_threads() == threads
            out.append(run())
    finally:
        set_threads(previous)
    return out


@pytest.mark.parametrize("shape, perm", [
    ((32, 32, 128), (1, 0, 2)),  # (T, B, E) <-> (B, T, E): rows of 128
    ((1, 32, 32, 3, 128), (3, 1, 2, 0, 4)),  # the packed projection's split
    ((32, 4, 32, 32), (0, 1, 3, 2)),  # K^T: oneDNN's reorder
    ((32, 4, 32, 32), (2, 0, 1, 3)),  # heads merged: rows of 32
    ((2, 300, 3, 40), (2, 1, 0, 3)),  # rows of 40, an odd number of rows a thread
    ((5, 37, 33), (2, 1, 0)),  # oneDNN's reorder
    ((6, 7, 20), (1, 0, 2)),  # small: one thread
])
def test_transpose_is_numpys_at_any_thread_count(shape, perm):
    rt = runtime.module()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    expected = np.ascontiguousarray(x.transpose(perm))

    def run():
        y = np.full(expected.shape, np.nan, np.float32)
        rt.transpose(list(shape), list(perm), x, y).run()
        return y
    for y in at_threads(run):
        np.testing.assert_array_equal(y, expected)


def test_transpose_takes_the_rows_loop_at_two_threads_only():
    rt = runtime.module()
    x = np.zeros((32, 32, 128), np.float32)
    names = at_threads(lambda: rt.transpose([32, 32, 128], [1, 0, 2], x, x.copy()).name, (1, 2))
    assert names == ["transpose", "transpose rows"]


@pytest.mark.parametrize("n", [7, 3 * (1 << 14) + 5])
def test_conversion_is_ml_dtypes_bits_at_any_thread_count(n):
    rt = runtime.module()
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32) * 100
    x[:3] = [np.nan, np.inf, -0.0]

    def run():
        half, back = np.zeros(n + 1, ml_dtypes.bfloat16), np.zeros(n + 1, np.float32)
        rt.convert(x, half, n).run()
        rt.convert(half, back, n).run()
        return half, back
    expected = x.astype(ml_dtypes.bfloat16)
    for half, back in at_threads(run):
        np.testing.assert_array_equal(half[:n].view(np.uint16), expected.view(np.uint16))
        assert half[n] == 0 and back[n] == 0  # nothing past n written
        np.testing.assert_array_equal(back[:n], expected.astype(np.float32))


@pytest.mark.parametrize("n", [100, 3 * (1 << 14) + 5])
def test_copy_accumulate_and_fill_in_chunks(n):
    rt = runtime.module()
    rng = np.random.default_rng(1)
    x, start = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)

    def run():
        copied, summed, filled = np.zeros(n, np.float32), start.copy(), np.zeros(n, np.float32)
        rt.copy(x, copied, n, False).run()
        rt.copy(x, summed, n, True).run()
        rt.fill(filled, n, 2.5).run()
        return copied, summed, filled
    for copied, summed, filled in at_threads(run):
        np.testing.assert_array_equal(copied, x)
        np.testing.assert_array_equal(summed, start + x)
        assert (filled == 2.5).all()


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("rows, cols, add", [(1024, 128, False), (1000, 384, True), (64, 10, True)])
def test_column_sum_is_the_same_bits_at_any_thread_count(dtype, rows, cols, add):
    rt = runtime.module()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((rows, cols)).astype(dtype)
    start = rng.standard_normal(cols).astype(np.float32)

    def run():
        y = start.copy() if add else np.full(cols, np.nan, np.float32)
        rt.column_sum(rows, cols, x, y, add).run()
        return y
    results = at_threads(run)
    expected = x.astype(np.float64).sum(0) + (start if add else 0)
    for y in results:
        np.testing.assert_array_equal(y, results[0])
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-3)


def test_conversion_rounds_every_bit_pattern_as_to_bf16():
    """Random float32 bit patterns, denormals (which the CPU's own conversion reads as 0: those
    lanes take the integer rounding), NaNs and values rounding to infinity: plan.hpp's
    to_bf16, bit for bit."""
    rt = runtime.module()
    bits = np.random.default_rng(4).integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    bits[:500] &= 0x807FFFFF  # denormals of either sign
    bits[500:600] = 0x7F800001 + np.arange(100, dtype=np.uint32)  # signalling and quiet NaNs
    bits[600:700] = 0x7F7FFFFF - np.arange(100, dtype=np.uint32)  # the largest: some to inf
    half = np.zeros(bits.size, ml_dtypes.bfloat16)
    rt.convert(bits.view(np.float32), half, bits.size).run()
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    expected = np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded)
    np.testing.assert_array_equal(half.view(np.uint16), expected)
