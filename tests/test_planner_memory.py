"""meta plan's memory per rank (meta/planner/memory.py): the ZeRO paper's parts for allreduce
and ZeRO-1/2/3, zero2 and zero3 among the ranked configurations with their α-β costs, and
``--memory GB`` dropping the configurations that do not fit."""

from __future__ import annotations

import re

import pytest

from meta.cli import main
from meta.planner.costs import predict_all, rank_configurations, reduce_scatter_s, within_memory
from meta.planner.machine import Machine
from meta.planner.memory import (
    EXCHANGE_SLOTS,
    MB,
    SCATTER_SLOTS,
    Memory,
    StepFacts,
    _plan_bytes,
    quiet,
    rank_memory,
    resident_bytes,
    runtime_bytes,
    step_facts,
    update_footprint,
    zero3_groups,
    zero_memory,
)
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
    # what meta's implementations hold beyond the paper's figure, named as buffers: the
    # packed gradient, the other ranks' slices read and this rank's sum (ZeRO-1 in shared
    # memory), the flat gradient the backward writes (ZeRO-2), two gathered groups and one
    # group's gradients (ZeRO-3); MPI's reduce-scatters in flight as temporaries
    assert m.buffers == {0: 4 * PSI, 1: 4 * PSI, 2: 4 * PSI, 3: 3 * 4 * PSI / 8}[stage]
    assert m.temporaries == {0: 0, 1: 0, 2: 4 * PSI, 3: 4 * PSI / 8}[stage] * SCATTER_SLOTS
    assert m.total == pytest.approx(sum(parts) * PSI + 123 + m.buffers + m.temporaries)
    assert m.model_state == m.total - 123 - m.temporaries


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
    assert zero2.memory == Memory(n, n / 4, 2 * n / 4, act, n, SCATTER_SLOTS * n)
    groups = zero3_groups(n // 4, 4)
    assert zero3.memory == Memory(n / 4, n / 4, 2 * n / 4, act, 3 * n / groups,
                                  SCATTER_SLOTS * n / groups)
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
    assert "params+grads+state+act+buf+tmp+run MB" in out


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


def test_update_footprint_is_what_the_optimizer_s_step_allocates():
    """The update's temporaries come from stepping the optimizer itself: Adam's new moments
    beside the old ones and its update (4 arrays the size of what it steps), plus the clipped
    gradient and the decayed update with AdamW and clipping (5); fused SGD-momentum steps in
    place (0); plain SGD makes its scaled update (1). Clipping is not elementwise: ZeRO-1 in
    shared memory cannot share out its update."""
    from meta.lv2.optimizers import Optimizer, adam, adamw, chain, clip_by_global_norm, sgd

    def facts(t):
        return update_footprint(lambda params: Optimizer(t, params))

    assert facts(adam(1e-3)) == pytest.approx((2, 4, 0, True), abs=0.05)
    assert facts(chain(clip_by_global_norm(1.0), adamw(1e-3))) == pytest.approx(
        (2, 5, 0, False), abs=0.05)
    assert facts(sgd(0.1, momentum=0.9)) == pytest.approx((1, 0, 0, True), abs=0.05)
    assert facts(sgd(0.1)) == pytest.approx((0, 1, 0, True), abs=0.05)
    assert update_footprint(lambda params: object()) is None  # not meta's: not known


@pytest.mark.parametrize("stage, elementwise, state, temps, buffers", [
    (0, True, 2, 5 + EXCHANGE_SLOTS, 0),  # overlapped: the buckets are the gradients
    (1, True, 2 / 4, 5 / 4, 1),  # each rank steps its slice
    (1, False, 2, 5, 2),  # clipping: every rank steps the shared mean, whole
    (2, False, 2 / 4, 5 / 4 + SCATTER_SLOTS, 1),  # a shard, whatever the optimizer
])
def test_update_temporaries_follow_what_each_strategy_steps(stage, elementwise, state, temps,
                                                            buffers):
    n = 4.0 * PSI
    m = zero_memory(n, 2, 0.0, 4, stage, update_slots=5, elementwise=elementwise,
                    overlapped=stage == 0)
    assert (m.state, m.temporaries, m.buffers) == pytest.approx(
        (state * n, temps * n, buffers * n))


def test_step_facts_ask_the_planned_executor_for_its_arrays():
    """The planned path's activations are the compiled plan's own arrays (arena and values
    kept apart, gradients excluded), measured at batches 1 and 2 and extended linearly:
    a plan compiled at batch 16 holds what the facts predict for 16."""
    import numpy as np

    from meta.lv1 import mlp
    from meta.lv1.plan.executor import PlannedExecutor
    from meta.lv2.optimizers import Optimizer, adam

    graph = mlp(hidden=[64])
    rng = np.random.default_rng(0)

    def feeds(batch):
        return {"input": rng.standard_normal((batch, 1, 28, 28)).astype(np.float32),
                "labels": rng.integers(0, 10, batch)}

    f = step_facts(graph, feeds, lambda p: Optimizer(adam(1e-3), p),
                   lambda g, **o: PlannedExecutor(g, **o), 2)
    assert f.planned is not None and f.planned[1] > 0 and f.activations(16, planned=False) > 0
    ex = PlannedExecutor(graph)
    ex.train()
    ex.inference_and_backprop(feeds(16), loss="loss")
    assert f.activations(16) == pytest.approx(_plan_bytes(ex), rel=0.01)
    assert (f.state_slots, f.update_whole, f.elementwise) == pytest.approx((2, 4, True), abs=0.05)
    # the ZeRO-3 rows: its layer groups' own plans and slots, asked from the strategy
    n = float(sum(p.nbytes for p in graph.parameters.values()))
    m3 = rank_memory(f, n, 16, 4, 3)
    if f.zero3 is not None:
        assert m3.activations == pytest.approx(f.zero3[0] + 16 * f.zero3[1])
        assert m3.buffers == f.zero3_slots > 0
    else:  # its groups run the reference path (not planned): the traced figure
        assert m3.activations == f.activations(16, planned=False)
    assert rank_memory(f, n, 16, 4, 2).activations == f.activations(16)
    # the process's own bytes beyond its arrays, measured at its first probe, on every row
    assert f.runtime == runtime_bytes() >= 0 and m3.runtime == f.runtime


def test_runtime_is_measured_from_the_resident_set_and_counted_in_the_total():
    """``resident_bytes`` sees what the process holds (an array written: its pages resident),
    and a row's total carries the facts' measured runtime as a part of its own."""
    import numpy as np

    before = resident_bytes()
    if before is None:
        pytest.skip("no /proc/self/statm or glibc here")
    held = np.ones(8 * MB // 4, np.float32)  # 8 MB, written
    assert resident_bytes() - before >= 7 * MB
    del held
    facts = StepFacts(2, 5, 0, True, (0.0, 1000.0), (0.0, 1000.0), 4.0, runtime=3 * MB)
    with_it = rank_memory(facts, 4 * PSI, 16, 4, 1)
    without = rank_memory(StepFacts(2, 5, 0, True, (0.0, 1000.0), (0.0, 1000.0), 4.0),
                          4 * PSI, 16, 4, 1)
    assert with_it.runtime == 3 * MB and with_it.total == without.total + 3 * MB
    assert with_it.parts_mb().endswith("+3.0")


def test_probes_say_nothing_and_leave_the_run_s_messages_unsaid(capsys):
    """The planner's probes are its own steps: what they say once (a strategy's note, an
    operator leaving oneDNN, a warning) is dropped, and still said by the user's run."""
    import warnings

    from meta.lv1.plan.precision import say_once

    line = "meta: a note a probe would say (test)"
    with quiet():
        say_once(line)
        warnings.warn("meta: a probe's warning (test)", RuntimeWarning)
    assert capsys.readouterr().err == ""
    say_once(line)
    assert capsys.readouterr().err == line + "\n"


@pytest.mark.slow  # 12 s on the loaded 2-core machine: the segments' plans compiled twice
def test_recompute_rows_hold_the_segmented_step_s_activations(capsys):
    """With the planned executor's ``recompute=blocks`` the facts hold the segmented step's
    arrays (one segment's working set and the kept segment inputs), and ``meta plan`` ranks
    every data-parallel configuration again with them, one forward longer."""
    import numpy as np

    from meta.lv1 import gpt
    from meta.lv1.plan.executor import PlannedExecutor
    from meta.lv2.optimizers import Optimizer, adam
    from meta.planner.costs import recompute_costs

    if "recompute" not in PlannedExecutor.options:
        pytest.skip("the planned executor has no recompute option here")
    graph = gpt((16,), classes=20, layers=3, heads=2, width=16, seed=0)
    rng = np.random.default_rng(0)

    def feeds(batch):
        return {"input": rng.integers(0, 20, (batch, 16)),
                "labels": rng.integers(0, 20, (batch, 16))}

    f = step_facts(graph, feeds, lambda p: Optimizer(adam(1e-3), p),
                   lambda g, **o: PlannedExecutor(g, **o), 2)
    assert f.recompute is not None
    assert capsys.readouterr().err == ""  # zero3's "recomputes each of its groups": unsaid
    assert f.activations(16, recompute=True) < 0.8 * f.activations(16)
    ex = PlannedExecutor(graph, recompute="blocks")
    ex.train()
    ex.inference_and_backprop(feeds(16), loss="loss")
    assert f.activations(16, recompute=True) == pytest.approx(_plan_bytes(ex), rel=0.02)
    work = synthetic()
    work = Workload(work.recipe, 16, work.layers, work.param_bytes, 2, work.update_s, "given",
                    facts=f)
    ranked = predict_all(work, Machine(nodes=1, ranks_per_node=4, memory_bytes=1 << 40), 4)
    again = recompute_costs(work, [pr for pr in ranked if "recompute" not in pr.sets])
    assert {pr.label for pr in again} <= {pr.label for pr in ranked}
    base = {pr.label: pr for pr in ranked}
    for pr in again:
        plain = base[pr.label.removesuffix(" + recompute blocks")]
        assert pr.sets == {**plain.sets, "recompute": "blocks"}
        hooked = pr.sets.get("distributed.overlap") != "false"
        if pr.strategy == "zero3":  # its own recompute, asked from the strategy
            assert pr.memory.activations == pytest.approx(
                f.zero3_recompute[0] + 16 * f.zero3_recompute[1])
            assert pr.memory.activations < plain.memory.activations
            continue
        assert pr.memory.activations == f.activations(16, recompute=True) + (
            work.param_bytes if hooked else 0)
        assert pr.step_s == pytest.approx(plain.step_s + work.forward_s)
    assert {pr.strategy for pr in again} >= {"allreduce", "zero2"}



def test_every_row_carries_the_same_runtime_part():
    """The process's runtime (what no array holds) is every rank's, whatever its strategy:
    model averaging, Downpour and the pipeline rows carry it as allreduce's do."""
    facts = StepFacts(2, 5, 0, True, (0.0, 1000.0), (0.0, 1000.0), 4.0, runtime=3 * MB)
    work = synthetic()
    work = Workload(work.recipe, 16, work.layers, work.param_bytes, 2, work.update_s, "given",
                    facts=facts)
    rows = predict_all(work, Machine(nodes=1, ranks_per_node=4, memory_bytes=1 << 40), 4)
    assert {r.strategy for r in rows} >= {"allreduce", "model_averaging", "downpour"}
    assert {r.memory.runtime for r in rows} == {3 * MB}, {r.label: r.memory.runtime
                                                        for r in rows}
