"""Arrays that crossed a process boundary reach the plan's kernels as any other (issue 39).

numpy gives an unpickled array an equal but distinct dtype object; the kernels that choose a
loop by dtype compared those objects by identity and refused them ("gather indices must be
int32 or int64"). They compare by value now (cpp/plan/embedding.cpp, the C++ custom operators'
dispatch in cpp/include/meta/custom_op.hpp). Checked here with ``pickle`` and with a
``multiprocessing`` loader sending token ids to an embedding, the way a data loader's worker
processes do, and with a whole graph pickled (a distributed worker's copy: its constant
indices carry unpickled dtypes too)."""

from __future__ import annotations

import multiprocessing
import pickle

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

VOCAB, WIDTH, SHAPE = 11, 4, (3, 5)


def crossed(x: np.ndarray) -> np.ndarray:
    """``x`` as another process would hand it over."""
    y = pickle.loads(pickle.dumps(x))
    assert y.dtype == x.dtype and y.dtype is not x.dtype  # what the kernels must accept
    return y


def embedding(dtype=np.int64):
    """ids -> table rows (the planned embedding kernel) -> loss = sum(rows * coeff)."""
    b = GraphBuilder("embedding", 17)
    ids = b.input("ids", dtype, SHAPE)
    rng = np.random.default_rng(0)
    table = b.initializer("table", rng.standard_normal((VOCAB, WIDTH)).astype(np.float32))
    rows = b.node("Gather", [table, ids], name="embed")
    coeff = b.initializer("coeff", rng.standard_normal((*SHAPE, WIDTH)).astype(np.float32))
    loss = b.node("ReduceSum", [b.node("Mul", [rows, coeff], name="weigh")], name="loss",
                  keepdims=0)
    b.output(loss, np.float32, ())
    return b.build()


def check_embedding(graph, ids: np.ndarray) -> None:
    planned = PlannedExecutor(graph)
    values, grads = planned.inference_and_backprop({"ids": ids})
    assert planned.unplanned is None and planned.placement()["embed"] == "native", \
        planned.placement()
    want_values, want_grads = ReferenceExecutor(graph).inference_and_backprop(
        {"ids": np.array(ids)})
    np.testing.assert_allclose(values["loss"], want_values["loss"], rtol=1e-5)
    np.testing.assert_allclose(grads["table"], want_grads["table"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_pickled_token_ids_feed_the_planned_embedding(dtype):
    ids = np.random.default_rng(1).integers(0, VOCAB, SHAPE).astype(dtype)
    check_embedding(embedding(dtype), crossed(ids))


def test_a_pickled_graphs_constant_indices_gather():
    """Gather by constant (initializer) indices in a graph that was pickled as a whole."""
    b = GraphBuilder("take", 17)
    x = b.input("x", np.float32, (4, 6))
    idx = b.initializer("idx", np.array([5, 0, 2], np.int64))
    y = b.node("Gather", [x, idx], name="take", axis=1)
    b.output(y, np.float32, (4, 3))
    graph = pickle.loads(pickle.dumps(b.build()))
    assert graph.initializers["idx"].dtype is not np.dtype(np.int64)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    got = PlannedExecutor(graph).inference({"x": crossed(x)}, [y])[y]
    np.testing.assert_array_equal(got, x[:, [5, 0, 2]])


def _token_batches(queue, seed: int, count: int) -> None:
    """A loader's worker process: ``count`` batches of int64 token ids into ``queue``."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        queue.put(rng.integers(0, VOCAB, SHAPE))  # int64, pickled across by the queue
    queue.put(None)


def test_a_multiprocessing_loader_feeds_the_planned_embedding():
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    worker = context.Process(target=_token_batches, args=(queue, 2, 3), daemon=True)
    worker.start()
    try:
        batches = []
        while (batch := queue.get(timeout=60)) is not None:
            batches.append(batch)
    finally:
        worker.join(timeout=60)
    assert len(batches) == 3 and all(b.dtype == np.int64 for b in batches)
    graph = embedding()
    for ids in batches:
        check_embedding(graph, ids)


@pytest.mark.slow  # compiles a C++ operator (10-30 s of CPU)
def test_a_cpp_operator_takes_pickled_arrays(tmp_path, monkeypatch):
    """The C++ custom operators' dtype dispatch (float32 or float64) by value, on the
    reference executor (the operator's entry) and the planned one (its bound kernel)."""
    from meta.lv0 import registry
    from meta.lv0.cpp_ops import register_cpp_op
    from meta.lv1.layers import Op, Sequential
    from tests.lv0.test_cpp_ops import SWISH

    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path))
    with registry.scratch():
        register_cpp_op("Swish", SWISH, attributes={"beta": 1.0})
        for dtype in (np.float32, np.float64):
            graph = Sequential(Op("Swish", domain="ai.meta.custom", beta=1.5)).graph(
                (2, 4), seed=0, dtype=dtype)
            x = crossed(np.linspace(-3, 3, 16).reshape(2, 2, 4).astype(dtype))
            out = graph.outputs[0].name
            want = x * (1 / (1 + np.exp(-1.5 * x)))
            for executor in (ReferenceExecutor(graph), PlannedExecutor(graph)):
                got = executor.inference({graph.inputs[0].name: x}, [out])[out]
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=type(executor))
