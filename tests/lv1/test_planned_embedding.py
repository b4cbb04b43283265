"""Gather's planned kernels (``meta.lv1.plan.lowering.embedding``, cpp/plan/embedding.cpp): the
embedding (table rows by int32 or int64 ids) and Gather by constant indices along any axis,
with their scatter-add backward, against numpy and the reference executor; negative and
repeated ids, a gradient added to (a tied head) or written, the same bits at any thread
count, and an id out of range failing naming the node."""

from __future__ import annotations

import numpy as np
import pytest

from meta.common.threads import set_threads
from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

from .test_planned_attention import close

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

VOCAB, WIDTH = 7, 5


def lookup_model(dtype=np.int64, tied=False, shape=(4, 6), width=WIDTH):
    """ids -> table rows -> sum of rows * a constant (so that each token's dy differs); with
    ``tied``, the rows also go through a head whose weight is the table's transpose (the GPT's
    tie: the head's gradient reaches the table first, the embedding's adds to it)."""
    b = GraphBuilder("embedding", 17)
    ids = b.input("input", dtype, shape)
    rng = np.random.default_rng(0)
    table = b.initializer("table", rng.standard_normal((VOCAB, width)).astype(np.float32))
    rows = b.node("Gather", [table, ids], name="embed")
    coeff = b.initializer("coeff", rng.standard_normal((*shape, width)).astype(np.float32))
    h = b.node("Mul", [rows, coeff], name="weigh")
    if tied:
        head = b.node("Transpose", [table], name="head.t", perm=[1, 0])
        h = b.node("MatMul", [h, head], name="head")
    loss = b.node("ReduceSum", [b.node("Mul", [h, h], name="square")], name="loss",
                  keepdims=0)
    b.output(loss, np.float32, ())
    graph = b.build()
    return graph


def ids_with_repeats_and_negatives(dtype, shape=(4, 6), seed=1):
    ids = np.random.default_rng(seed).integers(-VOCAB, VOCAB, shape).astype(dtype)
    ids[0, :4] = [3, 3, -4, 3]  # -4 is row 3 too
    ids[1, :2] = [-1, VOCAB - 1]
    return ids


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("tied", [False, True])
def test_forward_and_table_gradient_match_the_reference(monkeypatch, dtype, tied):
    """Tied, the embedding's backward adds to the gradient the head wrote; else it writes."""
    graph = lookup_model(dtype, tied)
    feeds = {"input": ids_with_repeats_and_negatives(dtype)}
    rt, adds = runtime.module(), []
    monkeypatch.setattr(rt, "gather_backward", lambda *a, f=rt.gather_backward: (
        adds.append(a[7]), f(*a))[1])
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(
        feeds, outputs=["embed"])
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds, outputs=["embed"])
    assert planned.placement()["embed"] == "native"
    steps = [s.name for s in planned._last.records["backward"]]
    assert "Gather backward" in steps and adds == [tied]
    np.testing.assert_array_equal(values["embed"], ref_values["embed"])
    close(values["loss"], ref_values["loss"], "loss")
    close(grads["table"], ref_grads["table"], "table gradient")


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("add", [False, True])
def test_kernel_is_numpys_take_and_add_at_bit_for_bit(dtype, add):
    """The steps on their own: forward is np.take; backward sums each row's tokens in token
    order from zero (or from what the gradient held, ``add``), as np.add.at does."""
    rt = runtime.module()
    rng = np.random.default_rng(2)
    rows, width, n = 11, 21, 40  # width not a multiple of a cache line's 16 floats
    table = rng.standard_normal((rows, width)).astype(np.float32)
    ids = rng.integers(-rows, rows, n).astype(dtype)
    y = np.full((n, width), 7.0, np.float32)
    rt.gather(1, rows, width, n, ids, table, y, "e").run()
    np.testing.assert_array_equal(y, np.take(table, ids, axis=0))
    dy = rng.standard_normal((n, width)).astype(np.float32)
    dw = rng.standard_normal((rows, width)).astype(np.float32)
    expected = dw.copy() if add else np.zeros_like(dw)
    np.add.at(expected, ids % rows, dy)
    rt.gather_backward(1, rows, width, n, ids, dy, dw, add, "e").run()
    np.testing.assert_array_equal(dw, expected)


@pytest.mark.parametrize("add", [False, True])
def test_backward_gives_the_same_bits_at_one_two_and_three_threads(add):
    """Large enough to run in parallel (2048 tokens of width 72: columns split unevenly),
    with skewed ids (a few rows take most tokens, as a character model's common letters)."""
    rt = runtime.module()
    rng = np.random.default_rng(3)
    rows, width, n = 65, 72, 2048
    ids = np.minimum(rng.geometric(0.2, n) - 1, rows - 1).astype(np.int64)
    dy = rng.standard_normal((n, width)).astype(np.float32)
    start = rng.standard_normal((rows, width)).astype(np.float32)
    previous = rt.max_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            set_threads(threads)
            assert rt.max_threads() == threads
            dw = start.copy()
            rt.gather_backward(1, rows, width, n, ids, dy, dw, add, "e").run()
            results.append(dw)
    finally:
        set_threads(previous)
    expected = start.copy() if add else np.zeros_like(start)
    np.add.at(expected, ids, dy)
    for dw in results:
        np.testing.assert_array_equal(dw, expected)


def test_planned_gradient_is_the_same_at_one_and_two_threads():
    """2048 tokens of width 40: the backward runs in parallel (the other nodes are
    elementwise, so any difference would be the embedding's)."""
    graph = lookup_model(np.int64, shape=(32, 64), width=40)
    feeds = {"input": np.random.default_rng(4).integers(-VOCAB, VOCAB, (32, 64))}
    previous = runtime.module().max_threads()
    grads = []
    try:
        for threads in (1, 2):
            set_threads(threads)
            grads.append(PlannedExecutor(graph).train().inference_and_backprop(feeds)[1])
    finally:
        set_threads(previous)
    np.testing.assert_array_equal(grads[0]["table"], grads[1]["table"])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bad", [VOCAB, -VOCAB - 1])
def test_an_id_out_of_range_fails_in_one_line_naming_the_node(dtype, bad):
    planned = PlannedExecutor(lookup_model(dtype)).train()
    ids = np.zeros((4, 6), dtype)
    planned.inference_and_backprop({"input": ids})
    ids[2, 3] = bad
    with pytest.raises(IndexError) as caught:
        planned.inference_and_backprop({"input": ids})
    assert str(caught.value) == f"node 'embed': Gather index out of range [-{VOCAB}, " \
                                f"{VOCAB - 1}]"


def test_ids_of_another_integer_type_run_the_operators_code_saying_why():
    graph = lookup_model(np.int16)
    feeds = {"input": ids_with_repeats_and_negatives(np.int16)}
    _, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(feeds)
    planned = PlannedExecutor(graph).train()
    _, grads = planned.inference_and_backprop(feeds)
    assert planned.placement()["embed"].startswith("python (Gather: ids of dtype int16")
    close(grads["table"], ref_grads["table"], "table gradient")


def constant_gather_model(index, axis, shared=False, shape=(4, 6, 5)):
    """p * c -> Gather(., constant index, axis) -> sum of squares; with ``shared``, p * c is
    also summed on its own, so the Gather's gradient adds to what that sum wrote."""
    b = GraphBuilder("constant_gather", 17)
    rng = np.random.default_rng(5)
    p = b.initializer("p", rng.standard_normal(shape).astype(np.float32))
    h = b.node("Mul", [p, b.initializer("c", rng.standard_normal(shape).astype(np.float32))],
               name="scale")
    picked = b.node("Gather", [h, b.initializer("index", np.asarray(index, np.int64))],
                    name="pick", axis=axis)
    loss = b.node("ReduceSum", [b.node("Mul", [picked, picked], name="square")],
                  name="sq" if shared else "loss", keepdims=0)
    if shared:
        loss = b.node("Add", [loss, b.node("ReduceSum", [h], name="all", keepdims=0)],
                      name="loss")
    b.output(loss, np.float32, ())
    return b.build()


@pytest.mark.parametrize("index,axis", [
    (0, 1), (-1, 1), (2, 2),  # one index after a batch axis: h[:, 0], no view
    ([0, 3, 3, -1], 1), ([[1, 1], [0, 2]], 0), ([4, 0, 4], 2), ([2, 2, 0], -1)])
@pytest.mark.parametrize("shared", [False, True])
def test_gather_by_constant_indices_matches_the_reference(monkeypatch, index, axis, shared):
    """Shared, the Gather's backward adds to the gradient the other sum wrote."""
    graph = constant_gather_model(index, axis, shared)
    rt, adds = runtime.module(), []
    monkeypatch.setattr(rt, "gather_backward", lambda *a, f=rt.gather_backward: (
        adds.append(a[7]), f(*a))[1])
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(
        {}, outputs=["pick"])
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop({}, outputs=["pick"])
    assert planned.placement()["pick"] == "native" and adds == [shared]
    np.testing.assert_array_equal(values["pick"], ref_values["pick"])
    close(values["loss"], ref_values["loss"], "loss")
    close(grads["p"], ref_grads["p"], "gradient")


def test_gather_of_one_index_after_ones_stays_a_view():
    graph = constant_gather_model(3, 1, shape=(1, 6, 5))
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop({})
    assert planned.placement()["pick"] == "view"


@pytest.mark.parametrize("outer", [1, 2, 5])
@pytest.mark.parametrize("add", [False, True])
def test_backward_over_slabs_gives_the_same_bits_at_any_thread_count(outer, add):
    """Fewer slabs than threads: columns split; as many or more: slabs split."""
    rt = runtime.module()
    rng = np.random.default_rng(6)
    rows, inner, n = 40, 48, 300
    ids = rng.integers(-rows, rows, n)
    dy = rng.standard_normal((outer, n, inner)).astype(np.float32)
    start = rng.standard_normal((outer, rows, inner)).astype(np.float32)
    expected = start.copy() if add else np.zeros_like(start)
    np.add.at(expected, (slice(None), ids % rows), dy)
    previous = rt.max_threads()
    try:
        for threads in (1, 2, 3):
            set_threads(threads)
            dx = start.copy()
            rt.gather_backward(outer, rows, inner, n, ids, dy, dx, add, "g").run()
            np.testing.assert_array_equal(dx, expected, err_msg=f"{threads} threads")
            y = np.empty_like(dy)
            rt.gather(outer, rows, inner, n, ids, start, y, "g").run()
            np.testing.assert_array_equal(y, np.take(start, ids, axis=1))
    finally:
        set_threads(previous)


def split_model(indices, used=None, shape=(3, 4, 5), axis=0):
    """p * c split by one-index Gathers (views) along ``axis``, as PyTorch's packed attention
    projection is split into Q, K and V; each part used (or not, ``used``) in the loss."""
    b = GraphBuilder("split", 17)
    rng = np.random.default_rng(7)
    p = b.initializer("p", rng.standard_normal(shape).astype(np.float32))
    h = b.node("Mul", [p, b.initializer("c", rng.standard_normal(shape).astype(np.float32))],
               name="scale")
    terms = []
    for k, i in enumerate(indices):
        part = b.node("Gather", [h, b.initializer(f"i{k}", np.asarray(i, np.int64))],
                      name=f"part{k}", axis=axis)
        if used is not None and not used[k]:
            continue
        if k % 2:  # sum of squares
            term = b.node("Mul", [part, part], name=f"sq{k}")
        else:  # weighted sum
            term = b.node("Mul", [part, b.initializer(f"w{k}", rng.standard_normal(
                shape[axis + 1:]).astype(np.float32))], name=f"weigh{k}")
        terms.append(b.node("ReduceSum", [term], name=f"sum{k}", keepdims=0))
    loss = terms[0]
    for k, t in enumerate(terms[1:]):
        loss = b.node("Add", [loss, t], name="loss" if k == len(terms) - 2 else f"add{k}")
    b.output(loss, np.float32, ())
    return b.build()


@pytest.mark.parametrize("indices,used,axis,shape,tiled", [
    ([0, 1, 2], None, 0, (3, 4, 5), True),  # Q, K, V
    ([2, 0, -2], None, 0, (3, 4, 5), True),  # in another order, one index negative
    ([0, 1, 2, 3], None, 1, (1, 4, 6), True),  # after a leading 1
    ([0, 2], None, 0, (3, 4, 5), False),  # the middle block has no gradient: zeros
    ([0, 1, 2], [True, False, True], 0, (3, 4, 5), False),  # K unused: its block is zeros
    ([0, 1, 1, 2], None, 0, (3, 4, 5), False)])  # a block read twice: its gradients sum
def test_a_tensor_split_by_one_index_gathers_gets_its_gradient_without_zeroing(
        indices, used, axis, shape, tiled):
    graph = split_model(indices, used, shape, axis)
    _, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop({})
    planned = PlannedExecutor(graph).train()
    planned.inference_and_backprop({})
    _, grads = planned.inference_and_backprop({})  # the second: nothing left from the first
    assert all(planned.placement()[f"part{k}"] == "view" for k in range(len(indices))
               if used is None or used[k])
    close(grads["p"], ref_grads["p"], "gradient")
    names = planned._last.programs["backward"].names
    assert ("fill" not in names) == tiled, names


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_by_fed_ids_along_any_axis_matches_the_reference(axis):
    """The kernel takes ids that vary along any axis of float32 data: (4, 6, 5) by (2, 3)."""
    shape = (4, 6, 5)
    b = GraphBuilder("fed_gather", 17)
    rng = np.random.default_rng(8)
    ids = b.input("input", np.int64, (2, 3))
    p = b.initializer("p", rng.standard_normal(shape).astype(np.float32))
    h = b.node("Mul", [p, b.initializer("c", rng.standard_normal(shape).astype(np.float32))],
               name="scale")
    picked = b.node("Gather", [h, ids], name="pick", axis=axis)
    loss = b.node("ReduceSum", [b.node("Mul", [picked, picked], name="square")], name="loss",
                  keepdims=0)
    b.output(loss, np.float32, ())
    graph = b.build()
    size = shape[axis]
    feeds = {"input": np.array([[0, size - 1, -1], [1, 1, -size]], np.int64)}
    ref_values, ref_grads = ReferenceExecutor(graph).train().inference_and_backprop(
        feeds, outputs=["pick"])
    planned = PlannedExecutor(graph).train()
    values, grads = planned.inference_and_backprop(feeds, outputs=["pick"])
    assert planned.placement()["pick"] == "native"
    np.testing.assert_array_equal(values["pick"], ref_values["pick"])
    close(grads["p"], ref_grads["p"], "gradient")
