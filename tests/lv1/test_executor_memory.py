"""Freeing intermediates, per-op profiling and micro-batched gradients."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from meta.lv1 import GraphError, ReferenceExecutor, mlp


def deep_mlp(dtype=np.float64):
    return mlp(input_shape=(16,), hidden=(64, 64, 64, 64), classes=5, seed=2, dtype=dtype)


def batch(n=32, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    return {"input": rng.standard_normal((n, 16)).astype(dtype), "labels": rng.integers(0, 5, n)}


def test_intermediates_are_freed_once_nothing_needs_them():
    graph, f = deep_mlp(), batch(256)
    freeing, keeping = ReferenceExecutor(graph), ReferenceExecutor(graph, free_intermediates=False)
    a = freeing.inference(f, ["logits"])
    b = keeping.inference(f, ["logits"])
    np.testing.assert_array_equal(a["logits"], b["logits"])
    one_activation = 256 * 64 * 8
    # Without freeing every activation stays (9 of them); with it, about two at a time.
    assert keeping.peak_intermediate_bytes >= 8 * one_activation
    assert freeing.peak_intermediate_bytes <= 3 * one_activation


def test_freeing_lowers_the_traced_peak():
    graph, f = deep_mlp(), batch(2048)

    def peak(ex):
        tracemalloc.start()
        ex.inference(f, ["logits"])
        result = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return result

    assert peak(ReferenceExecutor(graph)) < 0.5 * peak(
        ReferenceExecutor(graph, free_intermediates=False))


def test_requested_intermediates_survive_freeing():
    ex = ReferenceExecutor(deep_mlp())
    out = ex.inference(batch(), ["fc0", "relu0", "loss"])
    np.testing.assert_array_equal(out["relu0"], np.maximum(out["fc0"], 0))
    values, _ = ex.inference_and_backprop(batch(), outputs=["relu1", "logits"])
    assert set(values) == {"loss", "relu1", "logits"}


def test_profile_records_forward_and_backward_per_op_type():
    ex = ReferenceExecutor(deep_mlp(), profile=True)
    ex.inference_and_backprop(batch())
    ex.inference_and_backprop(batch())
    table = ex.profile_table()
    rows = {(r.op_type, r.phase): r for r in table.rows}
    assert rows["Gemm", "forward"].calls == 2 * 5 and rows["Gemm", "backward"].calls == 2 * 5
    assert rows["Relu", "forward"].calls == 2 * 4
    assert sum(r.share for r in table.rows) == pytest.approx(1.0)
    assert table.total_ms > 0
    text = str(table)
    assert "Gemm" in text and "backward" in text and "total" in text
    ex.reset_profile()
    assert not ex.profile_table().rows
    assert not ReferenceExecutor(deep_mlp()).records  # off by default


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_micro_batched_gradients_equal_the_full_batch(k):
    graph = deep_mlp()
    ex = ReferenceExecutor(graph)
    f = batch(30)  # 30 / 4 and 30 / 7 give unequal slices: the weights must be size / total
    full_values, full = ex.inference_and_backprop(f, outputs=["logits"])
    values, grads = ex.inference_and_backprop(f, outputs=["logits"], micro_batches=k)
    assert set(grads) == set(full) and set(values) == set(full_values)
    for name, g in full.items():
        np.testing.assert_allclose(grads[name], g, rtol=1e-12, atol=1e-14, err_msg=name)
    np.testing.assert_allclose(values["loss"], full_values["loss"], rtol=1e-13)
    np.testing.assert_allclose(values["logits"], full_values["logits"], rtol=1e-13)
    assert values["loss"].shape == () and values["loss"].dtype == np.float64


def test_micro_batches_in_float32_match_within_float_tolerance():
    graph = deep_mlp(np.float32)
    ex = ReferenceExecutor(graph)
    f = batch(64, np.float32)
    full = ex.inference_and_backprop(f)[1]
    for name, g in ex.inference_and_backprop(f, micro_batches=8)[1].items():
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, full[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_bad_micro_batch_requests_are_named():
    ex = ReferenceExecutor(deep_mlp())
    f = batch(4)
    with pytest.raises(GraphError, match="micro_batches=5 must be between 1 and the batch size 4"):
        ex.inference_and_backprop(f, micro_batches=5)
    with pytest.raises(GraphError, match="disagree on the batch size"):
        ex.inference_and_backprop({**f, "labels": f["labels"][:3]}, micro_batches=2)
