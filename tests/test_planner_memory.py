"""meta plan's memory per rank (meta/planner/memory.py): the ZeRO paper's parts for allreduce
and ZeRO-1/2/3, zero2 and zero3 among the ranked configurations with their α-β costs, and
``--memory GB`` dropping the configurations that do not fit."""

from __future__ import annotations

import re

import pytest

from meta.cli import main
from meta.planner.costs import predict_all, rank_configurations, reduce_scatter_s, within_memory
from meta.planner.machine import Machine
from meta.planner.memory import MB, Memory, zero3_groups, zero_memory
from meta.planner.workload import Layer, Workload, make_workload
from meta.run.recipe import load_recipe

PSI = 1_000_000  # parameters (float32: 4 bytes each)


@pytest.mark.parametrize("stage, parts", [
    (0, (4, 4, 8)),  # plain data parallelism: 16Ψ on every rank
    (1, (4, 4, 8 / 4)),  # ZeRO-1: the optimizer state sharded
    (2, (4, 4 / 4, 8 / 4)),  # ZeRO-2: state and gradients
    (3, (4 / 4, 4 / 4, 8 / 4)),  # ZeRO-3: all three, 16Ψ/P
])
def test_memory_parts_follow_the_zero_paper_at_four_ranks(stage, parts):
    """Float32 training with Adam (2 slots of state): parameters 4Ψ, gradients 4Ψ, state 8Ψ
    bytes unsharded; each stage shares out one more of them over P = 4."""
    m = zero_memory(4 * PSI, 2, activations=123.0, ranks=4, stage=stage, groups=8)
    assert (m.parameters, m.gradients, m.state) == tuple(x * PSI for x in parts)
    assert m.activations == 123.0
    # what meta's implementations hold beyond the paper's figure, named as buffers
    assert m.buffers == {0: 4 * PSI, 1: 0, 2: 4 * PSI, 3: 3 * 4 * PSI / 8}[stage]
    assert m.total == pytest.approx(sum(parts) * PSI + 123 + m.buffers)
    assert m.model_state == m.total - 123


def test_zero_memory_refuses_an_unknown_stage():
    with pytest.raises(ValueError, match="stage 4"):
        zero_memory(4.0, 2, 0.0, 4, 4)


def test_zero3_groups_mirror_the_strategy_s_default():
    assert zero3_groups(22_100_000, 100) == 12  # one per 2 M parameters, +1
    assert zero3_groups(1000, 100) == 2  # at least 2
    assert zero3_groups(22_100_000, 5) == 5  # no more than the graph's nodes


def synthetic(layers: int = 4, mb: float = 16.0) -> Workload:
    per = int(mb * MB / layers)
    return Workload("synthetic", 32, tuple(
        Layer(f"fc{i}", "Gemm", 1e-3, 2e-3, per, 4096) for i in range(layers)),
        per * layers, 2, 0.5e-3, "given")


def test_zero2_and_zero3_are_ranked_with_their_memory_and_link_costs():
    work = synthetic()
    machine = Machine(nodes=1, ranks_per_node=4, memory_bytes=1 << 40)
    by_name = {pr.strategy: pr for pr in predict_all(work, machine, 4)}
    n, act, link = work.param_bytes, work.activation_bytes * 32, machine.link(4)
    zero2, zero3 = by_name["zero2"], by_name["zero3"]
    assert zero2.memory == Memory(n, n / 4, 2 * n / 4, act, n)
    groups = zero3_groups(n // 4, 4)
    assert zero3.memory == Memory(n / 4, n / 4, 2 * n / 4, act, 3 * n / groups)
    # a reduce-scatter and an allgather (no progress thread: nothing hidden)
    half = 3 * link.alpha + 3 / 4 * n * link.beta
    assert reduce_scatter_s(link, 4, n) == pytest.approx(half)
    assert zero2.comm_s == pytest.approx(2 * half)
    # ZeRO-3: every group gathered twice and reduce-scattered once, n/G bytes each
    per_group = reduce_scatter_s(link, 4, n / groups)
    assert zero3.comm_s == pytest.approx(3 * groups * per_group)
    assert zero2.sets == {"distributed": "zero2"} and zero3.sets == {"distributed": "zero3"}
    allreduce = [pr for pr in predict_all(work, machine, 4) if pr.label == "allreduce"][0]
    assert allreduce.memory == Memory(n, n, 2 * n, act, n)
    assert zero3.memory_bytes < zero2.memory_bytes < allreduce.memory_bytes


def test_within_memory_keeps_exactly_the_rows_that_fit():
    work = synthetic()
    ranked = rank_configurations(work, Machine(nodes=1, ranks_per_node=4,
                                               memory_bytes=1 << 40), 4)
    zero3 = next(pr for pr in ranked if pr.strategy == "zero3")
    limit = zero3.memory_bytes  # fits exactly; every data-parallel replica does not
    kept, dropped = within_memory(ranked, limit)
    assert [pr for pr in ranked if pr.memory_bytes <= limit] == kept
    assert zero3 in kept and all(pr.memory_bytes > limit for pr in dropped)
    assert {pr.label for pr in dropped} >= {"allreduce", "allreduce overlapped",
                                             "ZeRO-2 (gradients and state sharded)"}
    assert len(kept) + len(dropped) == len(ranked)


def test_meta_plan_memory_drops_the_rows_that_do_not_fit(capsys, mnist_dir):
    recipe = load_recipe("recipes/mnist_allreduce.py")
    machine = Machine()
    ranked = rank_configurations(make_workload(recipe, machine), machine, 4)
    zero3 = next(pr for pr in ranked if pr.strategy == "zero3")
    gb = zero3.memory_bytes * 1.0001 / (1 << 30)
    fit = [pr for pr in ranked if pr.memory_bytes <= gb * (1 << 30)]
    assert 0 < len(fit) < len(ranked)
    assert main(["plan", "recipes/mnist_allreduce.py", "--ranks", "4", "--memory", str(gb),
                 "--top", "100"]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if "dropped" in x]
    assert len(lines) == 1 and f"dropped {len(ranked) - len(fit)} of {len(ranked)}" in lines[0]
    shown = [re.split(r"\s{2,}", x.strip())[1].split(" [")[0] for x in out.splitlines()
             if re.match(r"\s*\d+\s{2}\S", x)]
    assert shown == [pr.label for pr in fit]
    assert "params+grads+state+act+buf MB" in out


def test_meta_plan_memory_that_nothing_fits_is_one_line_and_exit_2(capsys, mnist_dir):
    assert main(["plan", "recipes/mnist_allreduce.py", "--ranks", "4", "--memory",
                 "0.00001"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--memory 1e-05 GB: none of the" in err[0] and "needs" in err[0]


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_meta_plan_memory_must_be_a_positive_number(capsys, value):
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--memory", value]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and f"--memory {float(value)}" in err[0]
