"""The GPT's pieces that tensor and pipeline parallelism must handle (int64 token inputs,
per-token targets, LayerNorm, the Gather of embeddings, heads, the causal mask, the head tied
to the embedding): the plans and partitions, and the checks of ``gpt_parallel_checks.py``
in-process and under ``mpiexec -n 2`` and ``-n 4``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv1.language_models import gpt
from meta.lv1.partition import PartitionError, partition
from meta.lv3 import SingleProcessCommunicator
from meta.lv3.tensor_parallel.plan import plan, probe
from meta.lv3.tensor_parallel.strategy import refuse_dropout

from . import gpt_parallel_checks
from .gpt_parallel_checks import CONTEXT, batch, small_gpt

SCRIPT = str(Path(gpt_parallel_checks.__file__))


@pytest.mark.parametrize("name", list(gpt_parallel_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    gpt_parallel_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])  # 4: one head a rank; 4 stages; oversubscribed
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=300)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(gpt_parallel_checks.CHECKS)} checks passed" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_plan_splits_heads_and_the_mlp_and_rebuilds_every_weight(ranks: int) -> None:
    graph = small_gpt()
    shapes = probe(graph, batch(2))
    plans = [plan(graph, shapes, r, ranks) for r in range(ranks)]
    heads = {r: p.constants["h0.attn.q.heads.shape@part"].tolist() for r, p in enumerate(plans)}
    assert heads == {r: [0, 0, 4 // ranks, 4] for r in range(ranks)}, heads
    merged = plans[0].constants["h0.attn.merged.shape@part"].tolist()
    assert merged == [0, 0, 16 // ranks], merged
    for name, whole in graph.parameters.items():
        shards = plans[0].shards[name]
        rebuilt = np.full_like(whole, np.nan)
        for r, shard in enumerate(shards):
            if shard.held_by(r):
                shard.put(rebuilt, shard.take(whole))
        np.testing.assert_array_equal(rebuilt, whole, err_msg=name)
    split = {n for n, s in plans[0].shards.items() if s[0].split}
    assert split == {f"h{i}.{x}" for i in range(2) for x in (
        "attn.q.weight", "attn.q.bias", "attn.k.weight", "attn.k.bias", "attn.v.weight",
        "attn.v.bias", "attn.proj.weight", "mlp.fc.weight", "mlp.fc.bias",
        "mlp.proj.weight")}, split


def test_heads_that_do_not_fall_whole_on_the_ranks_stay_replicated() -> None:
    """4 heads over 3 ranks: Q, K and V cannot split by whole heads, so attention stays whole;
    the MLP (64 features) still splits."""
    graph = small_gpt(layers=1)
    mine = plan(graph, probe(graph, batch(2)), 0, 3)
    kinds = {n: mine.layers[n].kind for n in ("h0.attn.q.matmul", "h0.attn.proj.matmul",
                                               "h0.mlp.fc.matmul", "h0.mlp.proj.matmul")}
    assert kinds == {"h0.attn.q.matmul": "replicated", "h0.attn.proj.matmul": "replicated",
                     "h0.mlp.fc.matmul": "column", "h0.mlp.proj.matmul": "row"}, kinds


def test_a_tied_embedding_is_held_by_both_stages_only_when_asked() -> None:
    graph = small_gpt()
    with pytest.raises(PartitionError, match="parameter 'wte' is read by nodes of stages"):
        partition(graph, 2, cuts=["h0.mlp.residual"])
    part = partition(graph, 2, cuts=["h0.mlp.residual"], tied=True)
    assert part.tied == {"wte": [0, 1]}
    first, last = part.stages
    # the mask and the head's Transpose are computed where they are read, never sent
    assert first.sends == ["h0.mlp.residual"] and last.receives == ["h0.mlp.residual"]
    assert "causal_mask" in first.nodes and "causal_mask" in last.nodes
    assert "lm_head.tied" in last.nodes and "lm_head.tied" not in first.nodes
    assert first.feeds == ["input"] and last.feeds == ["labels"]


def test_dropout_is_refused_under_tensor_parallelism() -> None:
    refuse_dropout(small_gpt())
    with pytest.raises(ComponentError, match="node 'emb.dropout' \\(Dropout\\)"):
        refuse_dropout(gpt((8,), classes=11, layers=1, heads=2, width=8, dropout=0.1))


def test_meta_plan_costs_the_split_the_strategy_makes() -> None:
    """``meta plan``'s tensor-parallel row runs each node at the share the strategy's own plan
    gives it (attention split by heads, LayerNorms, embedding and head whole) and makes the
    plan's 8 allreduces; without that plan it falls back to its estimate by layer kind."""
    from meta.lv3.tensor_parallel.plan import step_shape
    from meta.planner.costs import tensor_parallel_costs
    from meta.planner.machine import Machine
    from meta.planner.workload import Layer, Workload

    graph = small_gpt()
    shapes = probe(graph, batch(2))
    shape = step_shape(graph, shapes, 2, sequence=False)
    assert shape.shares["h0.attn.softmax"] == shape.shares["h1.mlp.fc.matmul"] == 0.5
    assert shape.shares["h0.ln1"] == shape.shares["tok_emb"] == shape.shares["loss"] == 1.0
    assert shape.allreduce_bytes == (CONTEXT * 16 * 8,) * 8  # float64 width 16 per example
    layers = tuple(Layer(n.name, n.op_type, 1e-3, 2e-3, 0, 0) for n in graph.nodes)
    work = Workload("gpt", 4, layers, 1, 2, 0.0, "test",
                    partitioned=lambda ranks: step_shape(graph, shapes, ranks, False))
    row = tensor_parallel_costs(work, Machine(), 2)[0]
    want = sum(3e-3 * shape.shares[n.name] for n in graph.nodes)
    assert row.compute_s == pytest.approx(want) and want < 3e-3 * len(graph.nodes)
    assert row.bytes_sent == pytest.approx(8 * 4 * CONTEXT * 16 * 8)  # 2(p-1)/p = 1 at p=2
    by_kind = tensor_parallel_costs(Workload("gpt", 4, layers, 1, 2, 0.0, "test"), Machine(),
                                    2)[0]
    assert by_kind.compute_s != pytest.approx(want)


def test_meta_plan_counts_a_reduce_scatter_or_all_gather_as_half_a_ring() -> None:
    """With sequence parallelism (the default) each allreduce is a reduce-scatter and an
    all-gather, each one pass of a ring (P-1)/P of its buffer, and one allreduce of the
    replicated parameters' gradients (bytes that do not grow with the batch): ``meta plan``'s
    bytes sent count each so, as its time does (it counted every one as a whole allreduce
    and left the fixed bytes out)."""
    from meta.lv3.tensor_parallel.plan import step_shape
    from meta.planner.costs import tensor_parallel_costs
    from meta.planner.machine import Machine
    from meta.planner.workload import Layer, Workload

    graph = small_gpt()
    shapes = probe(graph, batch(2))
    shape = step_shape(graph, shapes, 2)
    volumes = shape.volumes(4)
    halves = [v for v, half in volumes if half]
    whole = [v for v, half in volumes if not half]
    assert len(halves) == 16 and len(whole) == 1 and whole[0] > 0
    layers = tuple(Layer(n.name, n.op_type, 1e-3, 2e-3, 0, 0) for n in graph.nodes)
    work = Workload("gpt", 4, layers, 1, 2, 0.0, "test",
                    partitioned=lambda ranks: step_shape(graph, shapes, ranks))
    row = tensor_parallel_costs(work, Machine(), 2)[0]
    assert row.bytes_sent == pytest.approx(sum(halves) / 2 + whole[0])  # P = 2


def test_meta_plan_hides_the_backward_allreduces_behind_the_weight_gradients() -> None:
    """Each backward allreduce travels while the weight gradients of the column layers that
    read its copy are computed (the plan's scheduler): the model charges what they do not
    cover, and without a progress thread at least the transfer's bandwidth term (MPI moves
    it inside the tests, on the rank's core); a forward one is charged whole. The update is
    the parameters rank 0 holds."""
    from meta.lv3.comm.costmodel import Link
    from meta.lv3.tensor_parallel.plan import step_shape
    from meta.planner.costs import allreduce_s, tensor_parallel_costs
    from meta.planner.machine import Machine
    from meta.planner.workload import Layer, Workload

    graph = small_gpt()
    shapes = probe(graph, batch(2))
    shape = step_shape(graph, shapes, 2, sequence=False)
    assert shape.phases == ("backward", "forward") * 4
    assert shape.overlapped[:4] == (("h0.attn.q.matmul", "h0.attn.k.matmul",
                                     "h0.attn.v.matmul"), (), ("h0.mlp.fc.matmul",), ())
    assert shape.held_fraction == pytest.approx(
        plan(graph, shapes, 0, 2).bytes_of(graph) / graph.parameters.nbytes())
    layers = tuple(Layer(n.name, n.op_type, 1e-3, 2e-3, 0, 0) for n in graph.nodes)
    work = Workload("gpt", 4, layers, 1, 2, 0.01, "test",
                    partitioned=lambda ranks: step_shape(graph, shapes, ranks, False))
    nbytes = 4 * shape.allreduce_bytes[0]
    for link, progress in ((Link(1e-4, 1e-9), False), (Link(1e-4, 1e-9), True),
                           (Link(1e-3, 1e-9), False)):  # the last: more than they cover
        machine = Machine(intra=link, progress=progress)
        whole = allreduce_s(machine, 2, nbytes)
        floor = 0.0 if progress else nbytes * link.beta
        attention = max(whole - 3 * 2e-3 * 0.5 * 0.5, floor)  # q, k, v: dW half, rank's half
        mlp = max(whole - 2e-3 * 0.5 * 0.5, floor)
        row = tensor_parallel_costs(work, machine, 2)[0]
        assert row.comm_s == pytest.approx(4 * whole + 2 * (attention + mlp)), (link, progress)
        assert row.compute_s == pytest.approx(
            sum(3e-3 * shape.shares[n.name] for n in graph.nodes) + 0.01 * shape.held_fraction)
