"""Sequence parallelism of a tensor-parallel plan (``meta.lv3.tensor_parallel.sequence``):
which nodes run on each rank's rows, the collectives that replace the allreduces, the
parameters whose gradients are summed, what ``meta plan`` charges for them, and the
operators on one process. The equality of a step with one process's, at 2 and 4 ranks, is in
``gpt_parallel_checks.py`` (``check_*sequence_parallel*``)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import Context as OpContext
from meta.lv0 import InferenceContext
from meta.lv3 import SingleProcessCommunicator
from meta.lv3.tensor_parallel.ops import (DOMAIN, GatherRows, ReduceScatterRows, ScatterRows,
                                          ShareOfMean, bind, register_operators, release)
from meta.lv3.tensor_parallel.plan import StepShape, plan, probe, step_shape
from meta.lv3.tensor_parallel.rows import row_counts, rows

from .gpt_parallel_checks import CONTEXT, batch, small_gpt
from .partitioned_checks import batch as mlp_batch
from .partitioned_checks import small_mlp


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_gpt_runs_its_replicated_part_on_rows(ranks: int) -> None:
    graph = small_gpt()
    shapes = probe(graph, batch(2))
    mine = plan(graph, shapes, 0, ranks, sequence=True)
    layers = mine.layers
    rowwise = {n for n, layer in layers.items() if layer.kind == "rows"}
    assert {"tok_emb", "emb", "h0.ln1", "h0.attn.proj", "h0.attn.residual", "h1.ln2",
            "h1.mlp.residual", "ln_f", "lm_head", "logits", "loss"} <= rowwise, rowwise
    assert layers["lm_head.tied"].kind == "replicated"  # of the weight alone: no rows
    assert all(layers[n].share == 1 / ranks for n in rowwise)
    ops = {n.name: n.op_type for n in mine.nodes if n.domain == DOMAIN}
    assert ops["h0.ln1/copy"] == "GatherRows" and ops["input/rows"] == "ScatterRows"
    assert ops["h0.attn.proj.matmul/reduce_scatter"] == "ReduceScatterRows"
    assert ops["loss/share"] == "ShareOfMean" and ops["logits/gather"] == "GatherRows"
    kinds = [(c.phase, c.kind) for c in mine.collectives]
    per_pair = [("forward", "allgather"), ("backward", "reduce_scatter"),
                ("forward", "reduce_scatter"), ("backward", "allgather")]
    assert kinds == per_pair * 4 + [("output", "allgather"), ("backward", "allreduce")], kinds
    assert mine.partial_outputs == ["loss"]
    assert set(mine.partial_gradients) == {
        n for n, s in mine.shards.items() if graph.roles[n] == "parameter" and not s[0].split}
    summed = mine.collectives[-1]  # the partial gradients and the loss, one allreduce
    assert summed.fixed == sum(graph.initializers[n].nbytes for n in mine.partial_gradients) \
        + 8  # the float64 loss
    # the same bytes on the wire as the allreduces they replace: a reduce-scatter and an
    # all-gather of the whole buffer for each allreduce
    plain = plan(graph, shapes, 0, ranks)
    assert sum(c.nbytes(4) for c in mine.collectives if c.phase in ("forward", "backward")
               and c.kind != "allreduce") == 2 * plain.step_bytes(4)


def test_a_replicated_part_without_parameters_keeps_the_plain_plan() -> None:
    """An MLP's replicated part is its loss: two more meetings a pair would not pay."""
    graph = small_mlp()
    shapes = probe(graph, mlp_batch(graph, 2))
    plain, rows_ = plan(graph, shapes, 0, 2), plan(graph, shapes, 0, 2, sequence=True)
    assert [n.op_type for n in rows_.nodes] == [n.op_type for n in plain.nodes]
    assert rows_.collectives == plain.collectives and rows_.partial_gradients == []


def test_one_rank_splits_nothing() -> None:
    graph = small_gpt()
    shapes = probe(graph, batch(2))
    assert plan(graph, shapes, 0, 1, sequence=True).collectives == []


def test_meta_plan_charges_half_an_allreduce_for_each_row_collective() -> None:
    graph = small_gpt()
    shapes = probe(graph, batch(2))
    shape = step_shape(graph, shapes, 2)
    assert shape.shares["h0.ln1"] == shape.shares["tok_emb"] == shape.shares["loss"] == 0.5
    assert shape.kinds == ("allgather", "reduce_scatter", "reduce_scatter", "allgather") * 4 \
        + ("allreduce",)  # the gathered logits are left out (only when asked for)
    assert shape.overlapped[1] == ("h0.attn.q.matmul", "h0.attn.k.matmul", "h0.attn.v.matmul")
    assert shape.overlapped[0] == shape.overlapped[2] == shape.overlapped[3] == ()
    assert shape.fixed_bytes[-1] > 0 and shape.allreduce_bytes[-1] == 0
    assert shape.allreduce_bytes[0] == CONTEXT * 16 * 8  # float64 width 16 per example
    one = StepShape(2, {}, (100,), ("forward",), ((),), 1.0, ("allgather",), (0,))
    whole = StepShape(2, {}, (100,), ("forward",), ((),), 1.0, ("allreduce",), (0,))
    transfer = (lambda v: 1e-3 * v)
    assert one.waited(4, transfer, lambda v: 0.0, lambda n: 0.0)[0] == pytest.approx(
        whole.waited(4, transfer, lambda v: 0.0, lambda n: 0.0)[0] / 2)


def test_rows_split_a_batch_as_array_split_does() -> None:
    for n in range(0, 9):
        for ranks in (1, 2, 3, 4):
            parts = np.array_split(np.arange(n), ranks)
            assert [list(range(n))[rows(n, ranks, r)] for r in range(ranks)] == \
                [p.tolist() for p in parts]
    assert row_counts(np.zeros((5, 3, 2)), 2) == [18, 12]


def test_the_row_operators_on_one_process() -> None:
    """One rank holds every row: each collective is the identity, both ways; the loss's
    share counts the labels that are not ignored."""
    register_operators()
    key = bind(SingleProcessCommunicator())
    try:
        x = np.arange(12.0).reshape(3, 4)
        for op, args in ((ScatterRows(group=key), (x,)),
                         (GatherRows(group=key, reduce=1), (x, np.zeros(3))),
                         (GatherRows(group=key, reduce=0), (x, np.zeros(3))),
                         (ReduceScatterRows(group=key), (x,))):
            ctx = OpContext([True] + [False] * (len(args) - 1), True)
            (y,) = op.apply(ctx, *args)
            np.testing.assert_array_equal(y, x)
            np.testing.assert_array_equal(op.backward(ctx, x + 1)[0], x + 1)
        share = ShareOfMean(ignore_index=-1)
        ctx = OpContext([True, False, False], True)
        labels = np.array([[1, -1], [2, 3]])
        (y,) = share.apply(ctx, np.float64(2.0), labels[:1], labels)
        assert float(y) == pytest.approx(2.0 / 3)  # 1 of the 3 counted labels is here
        assert float(share.backward(ctx, np.float64(1.0))[0]) == pytest.approx(1 / 3)
        (y,) = share.apply(InferenceContext(), np.float64(2.0), labels, labels)
        assert float(y) == pytest.approx(2.0)
    finally:
        release(key)


def test_a_reduce_scatter_pair_owns_both_buffers_from_start_to_wait() -> None:
    """``overlap.add_pair`` with ``into``: the start and the wait read and write the source
    and the output, so the scheduler moves no step that touches either between them."""
    from meta.lv1.plan.builder import PlanBuilder
    from meta.lv1.plan.memory import Value
    from meta.lv1.plan.overlap import Start, Wait, add_pair, schedule

    values = {n: Value(n, (4,), np.dtype(np.float32)) for n in ("g", "out", "x", "y", "z")}
    pb = PlanBuilder(values, True, None)
    pb.step("free", ["x"], ["y"], lambda a: [], "backward")
    pb.step("reads out", ["out"], ["z"], lambda a: [], "backward")
    add_pair(pb, "rs", "g", lambda a: [], lambda a: [], lambda a: [], "backward", into="out")
    start, wait = pb.steps[-2:]
    assert isinstance(start, Start) and isinstance(wait, Wait)
    assert set(start.reads) == set(start.writes) == set(wait.writes) == {"g", "out"}
    order = [s.name for s in schedule(pb.steps, values)]
    assert order == ["reads out", "rs start", "free", "rs progress", "rs wait"], order
