"""meta plan (meta/planner/): a described cluster, predictions against hand-computed formulas,
the ranking, --set lines the recipe accepts, and --calibrate on this machine."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import replace
from typing import Callable

import pytest

from meta.cli import main
from meta.lv3.comm.costmodel import Link, shared_reduce
from meta.lv3.comm.polling import POLL_S
from meta.lv3.pipeline.schedule import schedule, simulate
from meta.planner.async_pattern import DOWNPOUR_PASSES, AsyncPattern
from meta.planner.calibrate import TWO_NODES_ENV
from meta.planner.machine import Machine, MachineError, RecipeCosts, load_machine, save_machine
from meta.planner.costs import (
    ACCUMULATE_PASSES,
    allreduce_costs,
    allreduce_s,
    averaging_costs,
    closed_queue,
    parameter_server_costs,
    pipeline_cost,
    rank_configurations,
    sharded_server_s,
    yielding_wait,
)
from meta.planner.report import best_sets, load_validation, settable, table
from meta.planner.workload import Layer, Workload
from meta.run.recipe import load_recipe

CLUSTER = """
name = "cluster"
nodes = 4
ranks_per_node = 8
flops = 1e11
memory_gib = 2
copy_beta = 1e-10

[intra]
alpha = 1e-6
beta = 1e-10

[inter]
alpha = 2e-5
beta = 1e-9
"""


@pytest.fixture
def cluster(tmp_path) -> Machine:
    path = tmp_path / "cluster.toml"
    path.write_text(CLUSTER)
    return load_machine(path)


def work(param_mb: float = 4.0, layers: int = 4, ms: float = 1.0) -> Workload:
    """``layers`` equal fully connected layers: each ``ms`` forward, twice that backward."""
    per = int(param_mb * (1 << 20) / layers)
    return Workload("synthetic", 64, tuple(
        Layer(f"fc{i}", "Gemm", ms / 1e3, 2 * ms / 1e3, per, 4096) for i in range(layers)),
        per * layers, 1, 0.5e-3, "given")


def test_machine_file_reads_and_round_trips(cluster, tmp_path):
    assert (cluster.nodes, cluster.ranks_per_node, cluster.ranks) == (4, 8, 32)
    assert cluster.memory_bytes == 2 * (1 << 30) and cluster.copy_beta == 1e-10
    assert cluster.inter == Link(2e-5, 1e-9) and cluster.intra == Link(1e-6, 1e-10)
    assert cluster.link(8) == cluster.intra and cluster.link(9) == cluster.inter
    assert cluster.sized(100).nodes == 13
    back = load_machine(save_machine(cluster, tmp_path / "again.toml"))
    assert back == cluster and not back.progress
    progressing = replace(cluster, progress=True)
    assert load_machine(save_machine(progressing, tmp_path / "p.toml")) == progressing
    reads = replace(cluster, shared_read_beta=4.2e-10)
    assert load_machine(save_machine(reads, tmp_path / "r.toml")) == reads


@pytest.mark.parametrize("text, message", [
    ("nodes = 2\nspeed = 3\n", "unknown key 'speed'"),
    ("[inter]\nalpha = 1e-6\n", r"\[inter\]: missing key 'beta'"),
    ("nodes = 0\n", "nodes must be >= 1"),
    ("progress = 1\n", "progress must be true or false, got 1"),
    ("nodes = [\n", "is not TOML"),
    # a rate of 0 divided by (a ZeroDivisionError traceback before); nan, inf: no prediction
    ("flops = 0\n", r"flops = 0.0: must be a finite number > 0"),
    ("flops = nan\n", r"flops = nan: must be a finite number > 0"),
    ("memory_gib = -1\n", r"memory = -1073741824.0: must be a finite number > 0"),
    ("copy_beta = inf\n", r"copy_beta = inf: must be a finite number >= 0"),
    ("[intra]\nalpha = -1e-6\nbeta = 1e-10\n", r"\[intra\]: alpha = -1e-06: must be"),
    ("costs = 3\n", "costs must be a table of recipes"),
    ("[costs.x]\nsignature = 'a'\nexecutor = 'e'\nbatch = 0\nforward_s = {}\n"
     "backward_s = {}\nstep_s = 1.0\n", r"\[costs.x\]: batch and ranks_measured must be"),
    ("[costs.x]\nsignature = 'a'\nexecutor = 'e'\nbatch = 8\nforward_s = 3\n"
     "backward_s = {}\nstep_s = 1.0\n", r"\[costs.x\]: 'int' object has no attribute"),
    ("[costs.x]\nsignature = 'a'\nexecutor = 'e'\nbatch = 8\nforward_s = {}\n"
     "backward_s = {}\nstep_s = 0.0\n", r"\[costs.x\]: step_s = 0.0: must be"),
])
def test_machine_file_errors_name_the_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(MachineError, match=message):
        load_machine(path)


def test_allreduce_prediction_is_the_seeds_formula(cluster):
    """P = 32 over 4 nodes: the inter link; n = 4 MiB: the tree's 2 log2(P) α + 2 (P-1)/P n β
    beats the ring's 2 (P-1) α + the same bandwidth term."""
    w, p, n = work(), 32, 4 * (1 << 20)
    a, b = 2e-5, 1e-9
    tree = 2 * math.log2(p) * a + 2 * (p - 1) / p * n * b
    ring = 2 * (p - 1) * a + 2 * (p - 1) / p * n * b
    assert tree < ring
    plain = allreduce_costs(w, cluster.sized(p), p)[0]
    assert plain.label == "allreduce"
    packed = 2 * n * 1e-10  # into one buffer, and scaled by 1/P
    assert plain.comm_s == pytest.approx(tree + packed)
    assert plain.step_s == pytest.approx(4e-3 + 8e-3 + tree + packed + 0.5e-3)
    assert plain.bytes_sent == pytest.approx(2 * 31 / 32 * n)
    # overlapped, where MPI progresses on its own: the backward (8 ms) hides the transfer
    # of every bucket but the last (1 MiB of 4), which goes after it; nothing is packed
    progressing = replace(cluster, progress=True).sized(p)
    overlapped = allreduce_costs(w, progressing, p)[1]
    assert tree * 3 / 4 < 8e-3
    assert overlapped.step_s == pytest.approx(4e-3 + 8e-3 + tree / 4 + 0.5e-3)
    # without (MPICH, Open MPI by default): the buckets move only inside the calls that
    # test them, so the whole transfer is waited for, less the packing
    unaided = allreduce_costs(w, cluster.sized(p), p)[1]
    assert unaided.step_s == pytest.approx(4e-3 + 8e-3 + tree + 0.5e-3)
    # within one node: ZeRO-1 through shared memory, 2 α + (P-1)/P n β and 1/P of the update
    zero = allreduce_costs(w, cluster, 8)[2]
    assert zero.comm_s == pytest.approx(2 * 1e-6 + 7 / 8 * n * 1e-10)
    assert zero.step_s == pytest.approx(12e-3 + zero.comm_s + 0.5e-3 / 8)


def test_model_averaging_divides_the_exchange_by_its_interval(cluster):
    w, p, n = work(), 16, 4 * (1 << 20)
    every_4 = next(pr for pr in averaging_costs(w, cluster.sized(p), p)
                   if pr.sets["distributed.average_every"] == "4")
    exchange = allreduce_s(cluster.sized(p), p, n) + 2 * n * 1e-10
    assert every_4.comm_s == pytest.approx(exchange / 4)
    assert every_4.step_s == pytest.approx(12e-3 + 0.5e-3 + exchange / 4)


def test_sharded_server_is_the_seeds_formula():
    link = Link(2e-5, 1e-9)
    assert sharded_server_s(link, 30, 2, 4e6) == pytest.approx(2 * 2e-5 + 2 * 30 * 1e-9
                                                                * 4e6 / 2)


def free_machine(**kw) -> Machine:
    """Messages and copies free: the schedule's own time."""
    return Machine(intra=Link(0.0, 0.0), inter=Link(0.0, 0.0), ranks_per_node=64,
                   copy_beta=0.0, **kw)


@pytest.mark.parametrize("stages, m", [(2, 4), (4, 8), (4, 16)])
def test_gpipe_bubble_is_s_minus_1_over_m_plus_s_minus_1(stages, m):
    """Equal stages and free messages: the simulated GPipe step is (M+S-1) micro-steps of
    one stage, its idle share (S-1)/(M+S-1)."""
    w = work(layers=stages)
    free = free_machine()
    pr = pipeline_cost(w, free, stages, stages, m, "gpipe", 1)
    assert pr.notes == (f"bubble {(stages - 1) / (m + stages - 1):.3f}",)
    micro = 3e-3 / m
    assert pr.step_s == pytest.approx((m + stages - 1) * micro + 0.5e-3 / stages)
    one_f = pipeline_cost(w, free, stages, stages, m, "1f1b", 1)
    assert one_f.memory_bytes < pr.memory_bytes  # 1F1B keeps at most S micro-batches


def test_a_pipeline_waits_for_its_slowest_stage_s_share_of_the_network():
    """Steps of 0.5 and 1.5 times the mean: the larger of two stages' steps is 1.25 of the
    mean, so 2 stages wait 25 % of a stage's work per step (3 ms of the network's 6 ms
    forward and backward: 0.75 ms), not 25 % of the whole network's (1.5 ms)."""
    stages, m = 2, 4
    w = work(layers=stages)
    free = free_machine()
    steady = pipeline_cost(w, free, stages, stages, m, "gpipe", 1)
    spread = replace(w, spread=(0.5, 1.5))
    waiting = pipeline_cost(spread, free, stages, stages, m, "gpipe", 1)
    assert spread.sync_fraction(2) == pytest.approx(0.25)
    assert waiting.step_s - steady.step_s == pytest.approx(0.25 * 6e-3 / stages)


def test_a_pipeline_stage_sums_each_micro_batch_s_gradients():
    """Each backward adds its micro-batch's gradients into the stage's accumulators, a pass
    of 1.5 copies over the stage's parameters: GPipe's (M+S-1) micro-steps each longer."""
    stages, m, beta = 2, 4, 1e-10
    w = work(layers=stages)
    free = pipeline_cost(w, free_machine(), stages, stages, m, "gpipe", 1)
    summed = pipeline_cost(w, replace(free_machine(), copy_beta=beta), stages, stages, m,
                            "gpipe", 1)
    per_stage = w.param_bytes / stages
    assert summed.step_s - free.step_s == pytest.approx(
        (m + stages - 1) * ACCUMULATE_PASSES * per_stage * beta)


def test_stages_beyond_the_cores_are_predicted_between_sharing_and_taking_turns():
    """4 stages measured stepping at once on 2 cores (each at half a core): the step is
    midway between the stages always sharing the cores at that speed and the stages taking
    turns, two operations at a time at a core's speed, each message half a poll late (as
    ``simulate`` with 2 cores plays it); both bounds are noted."""
    stages, m = 4, 8
    w = replace(work(layers=stages), ranks_measured=4)
    pr = pipeline_cost(w, free_machine(cores=2), stages, stages, m, "1f1b", 1)
    plans = [schedule("1f1b", s, stages, m) for s in range(stages)]
    late = [POLL_S / 2] * (stages - 1)
    turns = simulate(plans, [0.5e-3 / m] * stages, [1e-3 / m] * stages, late, late, cores=2)
    shared = simulate(plans, [1e-3 / m] * stages, [2e-3 / m] * stages)
    assert pr.step_s == pytest.approx((turns.step_s + shared.step_s) / 2 + 0.5e-3 / stages)
    assert pr.notes[1] == (f"stages take turns on 2 cores: {turns.step_s * 1e3:.2f}-"
                           f"{shared.step_s * 1e3:.2f} ms")
    assert pipeline_cost(w, free_machine(), stages, stages, m, "1f1b", 1).step_s == \
        pytest.approx(shared.step_s + 0.5e-3 / stages)


def test_a_micro_batch_keeps_each_call_s_fixed_cost():
    """Half of each node's time is per call: a micro-batch of 1/M costs fixed + rest/M, not
    1/M of the whole (the executor's overhead does not shrink with the batch)."""
    stages, m = 2, 8
    w = work(layers=stages)
    w = Workload(w.recipe, w.batch, tuple(Layer(x.name, x.op_type, x.forward_s, x.backward_s,
                                                x.param_bytes, x.activation_bytes,
                                                x.forward_s / 2, x.backward_s / 2)
                                          for x in w.layers), w.param_bytes, w.state_slots,
                 w.update_s, w.source)
    assert w.layers[0].at(1 / m).forward_s == pytest.approx(0.5e-3 + 0.5e-3 / m)
    free = free_machine()
    pr = pipeline_cost(w, free, stages, stages, m, "gpipe", 1)
    micro = 1.5e-3 + 1.5e-3 / m  # a stage's forward and backward of one micro-batch
    assert pr.step_s == pytest.approx((m + stages - 1) * micro + 0.5e-3 / stages)
    assert w.at_batch(32).layers[0].forward_s == pytest.approx(0.5e-3 + 0.5e-3 / 2)


def test_ranking_is_sane(cluster):
    ranked = rank_configurations(work(), cluster, 32)
    speeds = [pr.throughput for pr in ranked if pr.fits]
    assert speeds == sorted(speeds, reverse=True)
    assert {"allreduce", "downpour", "hybrid_allreduce", "partitioned"} <= {
        pr.strategy for pr in ranked}
    # one rank: nothing to communicate
    assert all(abs(pr.comm_s) < 1e-12 for pr in allreduce_costs(work(), cluster, 1))
    # a network bigger than a rank's memory: replicas do not fit, pipelines' stages do
    huge = rank_configurations(work(param_mb=600), cluster, 32)
    assert not next(pr for pr in huge if pr.label == "allreduce").fits
    assert huge[0].fits and huge[0].strategy in ("hybrid_allreduce", "hybrid_downpour",
                                                 "partitioned")
    assert all(not pr.fits for pr in huge[[pr.fits for pr in huge].index(False):])
    assert "does not fit" in table(huge, top=len(huge))


def test_set_lines_parse_with_the_recipe(cluster):
    recipe = load_recipe("recipes/mnist_allreduce.py")
    ranked = rank_configurations(work(), cluster, 16)
    ok = [pr for pr in ranked if pr.strategy in ("allreduce", "downpour", "pipeline",
                                                  "hybrid_allreduce", "model_averaging")]
    assert ok and all(settable(pr, recipe) for pr in ok)
    allreduce = [pr for pr in ranked if pr.strategy == "allreduce"]
    text = best_sets(allreduce, recipe)
    assert "mpiexec -n 16 meta run recipes/mnist_allreduce.py --set distributed=allreduce" in text
    # a recipe that fixes its strategy: the winner as its MUTABLE entry
    fixed = best_sets(ranked, load_recipe("recipes/mnist_lenet.py"))
    assert "does not let --set choose it" in fixed and '"distributed": {' in fixed


def test_meta_plan_mnist_mlp_at_1024_ranks(cluster, tmp_path, capsys, mnist_dir):
    """The acceptance command, on a described cluster, with the plot."""
    path = tmp_path / "cluster.toml"
    save_machine(cluster, path)
    start = time.perf_counter()
    assert main(["plan", "recipes/mnist_mlp.py", "--ranks", "1024", "--machine", str(path),
                 "--plot", str(tmp_path / "scaling.png")]) == 0
    assert time.perf_counter() - start < 10
    out = capsys.readouterr().out
    assert "samples/s" in out and "meta plan: best:" in out and "P = 1024" in out
    assert (tmp_path / "scaling.png").stat().st_size > 10_000


def test_meta_plan_names_a_bad_machine_file(tmp_path, capsys):
    (tmp_path / "m.toml").write_text("nodes = 'x'\n")
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--machine",
                 str(tmp_path / "m.toml")]) == 2
    assert "m.toml" in capsys.readouterr().err


@pytest.mark.parametrize("line", ["flops = 0", "flops = nan", "[inter]\nalpha = 1\nbeta = -1"])
def test_meta_plan_with_a_bad_rate_in_the_machine_file_is_one_line_and_exit_2(
        tmp_path, capsys, line):
    (tmp_path / "m.toml").write_text(line + "\n")
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--machine",
                 str(tmp_path / "m.toml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"meta plan: machine file '{tmp_path / 'm.toml'}'")


@pytest.mark.parametrize("option", [["--sigma", "nan"], ["--sigma", "inf"], ["--sigma", "-1"],
                                    ["--compute-ms", "inf"], ["--compute-ms", "nan"]])
def test_meta_plan_simulate_refuses_a_value_that_is_not_a_finite_number(capsys, option):
    assert main(["plan", "mnist_mlp", "--simulate", "2", *option]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"meta plan: {option[0]} {float(option[1])}: "
                                               "must be a finite number"), err


def test_meta_plan_at_a_billion_ranks_answers_in_seconds(capsys, mnist_dir):
    """Nothing in the planner takes a step per rank (``closed_queue`` in closed form beyond
    EXACT_QUEUE clients): 10^9 ranks took over 240 s before; the imports and the data read
    to size the network take most of what is left."""
    start = time.perf_counter()
    assert main(["plan", "recipes/mnist_mlp.py", "--ranks", "1000000000"]) == 0
    assert time.perf_counter() - start < 10
    assert "P = 1000000000" in capsys.readouterr().out


def test_meta_plan_without_the_recipe_s_data_is_one_line_and_exit_2(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setenv("META_MNIST_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: (_ for _ in ()).throw(
        OSError("no network in this test")))
    assert main(["plan", "recipes/mnist_mlp.py", "--ranks", "4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("meta plan: ") and "mnist" in err[0], err


def test_calibrate_measures_this_machine(tmp_path, capsys, mnist_dir):
    """One process, a small batch, one timed step: per-node costs written and used."""
    out = tmp_path / "here.toml"
    assert main(["plan", "mnist_mlp", "--calibrate", str(out), "--steps", "1",
                 "--set", "batch_size=8"]) == 0
    machine = load_machine(out)
    costs = machine.costs["mnist_mlp"]
    assert costs.batch == 8 and costs.executor == "planned"
    assert set(costs.forward_s) >= {"fc0", "fc1", "logits"} and costs.forward_s["fc0"] > 0
    assert costs.backward_s["fc0"] > 0 and costs.step_s > 0
    assert "no MPI" in machine.source and machine.flops > 0
    assert machine.shared_read_beta is None  # one process: nothing shared, not measured
    capsys.readouterr()
    assert main(["plan", "mnist_mlp", "--ranks", "4", "--machine", str(out),
                 "--set", "batch_size=8"]) == 0
    assert "compute measured on planned at batch 8" in capsys.readouterr().out


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_calibrate_under_mpi_measures_the_link(tmp_path, mpirun: Callable[..., str],
                                               mnist_dir, ranks) -> None:
    """The link between two ranks fitted (not the defaults), written once by rank 0; and the
    asynchronous patterns with 1 and 2 workers: their steps, waits and the polled link."""
    out = tmp_path / "two.toml"
    env = {"META_MNIST_DIR": str(mnist_dir)} if mnist_dir else None
    log = mpirun(ranks, [sys.executable, "-m", "meta", "plan", "mnist_mlp", "--calibrate",
                         str(out), "--steps", "1", "--set", "batch_size=8"], env=env,
                 timeout=120)
    machine = load_machine(out)
    assert f"links measured with {ranks} ranks" in machine.source, log
    assert machine.intra != Machine().intra and machine.intra.beta > 0
    assert log.count("meta plan: wrote") == 1
    pattern = machine.costs["mnist_mlp"].pattern
    assert pattern is not None and pattern.ranks == ranks, log
    assert pattern.step_s > 0 and pattern.overlapped_step_s > 0 and pattern.pass_s > 0
    assert pattern.service_s > 0 and pattern.fetch_wait_s > 0
    assert machine.polled == pattern.link and pattern.link.alpha > 0
    assert f"asynchronous patterns at {ranks} ranks" in machine.source
    # the reads of what another rank just wrote: measured (ranks share this machine)
    assert machine.shared_read_beta is not None and machine.shared_read_beta >= 0, log
    assert "reads of what another rank just wrote" in machine.source


@pytest.mark.mpi
@pytest.mark.slow
def test_calibrate_on_two_emulated_nodes_measures_the_link_between_them(
        tmp_path, mpirun: Callable[..., str], mnist_dir) -> None:
    """Two ranks in two groups without shared memory between them (MPICH's cliques, TCP
    between): two nodes of one rank, sharing the host's cores, and the link between them
    measured (slower than shared memory), not the defaults."""
    from mpi4py import MPI

    if not MPI.Get_library_version().startswith("MPICH"):
        pytest.skip("the two-node emulation uses MPICH's MPIR_CVAR_NUM_CLIQUES")
    out = tmp_path / "two_nodes.toml"
    env = {**TWO_NODES_ENV, **({"META_MNIST_DIR": str(mnist_dir)} if mnist_dir else {})}
    log = mpirun(2, [sys.executable, "-m", "meta", "plan", "mnist_mlp", "--calibrate",
                     str(out), "--steps", "1", "--set", "batch_size=8"], env=env, timeout=120)
    machine = load_machine(out)
    assert (machine.nodes, machine.ranks_per_node) == (2, 1), log
    assert machine.cores == max(1, (os.cpu_count() or 1) // 2)
    assert "on 2 nodes (emulated on one host)" in machine.source, log
    assert machine.inter != Machine().inter and machine.inter.beta > 0
    assert machine.link(2) == machine.inter


def test_measured_errors_are_shown_and_marked_beyond_the_bound(cluster, tmp_path):
    ranked = allreduce_costs(work(), cluster, 2)
    rows = [{"recipe": "synthetic", "ranks": 2, "configuration": "allreduce", "error": -0.31},
            {"recipe": "synthetic", "ranks": 2, "configuration": "allreduce overlapped",
             "error": 0.05},
            {"recipe": "other", "ranks": 2, "configuration": "allreduce", "error": 0.0}]
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(rows))
    validation = load_validation(path, "synthetic")
    text = table(ranked, validation=validation, bound=0.2)
    lines = {line.split("  ")[1].strip(): line for line in text.splitlines()[2:]}
    assert lines["allreduce"].rstrip().endswith("-31% at P=2 beyond")
    assert lines["allreduce overlapped"].rstrip().endswith("+5% at P=2")
    assert lines["allreduce ZeRO-1 (shared memory)"].rstrip().endswith("-")


def test_calibrate_into_a_described_cluster_keeps_its_shape(cluster, tmp_path, mnist_dir):
    path = tmp_path / "cluster.toml"
    save_machine(cluster, path)
    assert main(["plan", "mnist_mlp", "--machine", str(path), "--calibrate",
                 str(tmp_path / "out.toml"), "--steps", "1", "--set", "batch_size=8"]) == 0
    out = load_machine(tmp_path / "out.toml")
    assert (out.nodes, out.ranks_per_node, out.inter, out.intra) == (4, 8, cluster.inter,
                                                                      cluster.intra)
    assert out.costs["mnist_mlp"].batch == 8 and "compute measured" in out.source


def test_a_set_without_a_value_is_one_line_and_exit_2(capsys) -> None:
    """The same KEY=VALUE parsing as meta run and compare (meta.run.recipe.parse_sets),
    worded as a user error: exit 2, not SystemExit's 1."""
    assert main(["plan", "recipes/mnist_mlp.py", "--ranks", "4", "--set", "lr"]) == 2
    err = capsys.readouterr().err
    assert err == "meta plan: --set expects KEY=VALUE, got 'lr'\n", err


def test_the_worst_measured_error_of_a_configuration_is_shown(cluster, tmp_path):
    rows = [{"recipe": "synthetic", "ranks": p, "configuration": "allreduce", "error": e}
            for p, e in ((2, 0.05), (3, -0.18), (4, 0.1))]
    path = tmp_path / "validation.json"
    path.write_text(json.dumps(rows))
    assert load_validation(path, "synthetic")["allreduce"]["ranks"] == 3
    # another machine's file (``--validated`` again): its worse row counts
    more = tmp_path / "sixteen_cores.json"
    more.write_text(json.dumps([{"recipe": "synthetic", "ranks": 16,
                                 "configuration": "allreduce", "error": 0.21}]))
    assert load_validation([path, more], "synthetic")["allreduce"]["ranks"] == 16
    assert main(["plan", "mnist_mlp", "--ranks", "16", "--validated", str(path),
                 "--validated", str(tmp_path / "missing.json")]) == 2


def test_closed_queue_is_mean_value_analysis():
    """One client never queues; many saturate the server (throughput 1/S); two by hand."""
    assert closed_queue(1, think_s=3.0, service_s=1.0) == pytest.approx(1.0)
    # n=1: R=1, X=1/4, Q=1/4; n=2: R=1.25, X=2/4.25, Q=2*1.25/4.25
    assert closed_queue(2, 3.0, 1.0) == pytest.approx(1.25)
    many = closed_queue(200, think_s=3.0, service_s=1.0)
    assert 200 / (3.0 + many) == pytest.approx(1.0, rel=1e-3)


@pytest.mark.parametrize("ratio", [1e-4, 10.0, 1e4, 2e4, 2.0001e4, 3e4, 1e6, 1e12])
def test_closed_queue_beyond_the_recursion_is_the_same_model(ratio, monkeypatch):
    """Beyond ``EXACT_QUEUE`` clients the product form's sum gives what the recursion gives,
    also at the knee (clients = think/service), where an approximation (Schweitzer's) was off
    by 25 %; and a billion clients take a fraction of a second."""
    from meta.planner import costs

    clients, service = 20_001, 1e-3
    exact = closed_queue(clients, ratio * service, service)
    monkeypatch.setattr(costs, "EXACT_QUEUE", 100)
    assert closed_queue(clients, ratio * service, service) == pytest.approx(exact, rel=1e-9)
    start = time.perf_counter()
    for workers in (10**9, int(ratio) + 7):
        assert closed_queue(workers, ratio * service, service) >= service
    assert time.perf_counter() - start < 1.0


class _TwoRanksInStep:
    """A communicator of two ranks whose second takes twice this rank's time at every step,
    this rank's slow spells included (what slows the host slows both)."""

    size = 2

    def barrier(self) -> None:
        pass

    def gather_obj(self, mine: list[float]) -> list[list[float]]:
        return [mine, [2 * t for t in mine]]

    def bcast_obj(self, obj):
        return obj


def test_the_wait_on_the_slowest_rank_comes_from_steps_taken_together():
    """The spread a synchronous step waits on is each rank's step over the ranks' mean of
    the same step: steps that vary by a factor of 50 (a slow spell both ranks share) leave
    only the second rank's constant 4/3 against the first's 2/3, one value per rank and step."""
    from meta.planner.calibrate import synchronized_spread

    times = iter([1e-4] * 3 + [5e-3] * 3)

    def run() -> None:
        time.sleep(next(times))

    spread = synchronized_spread(run, _TwoRanksInStep(), steps=4, warmup=2)
    assert len(spread) == 8
    assert spread[:4] == pytest.approx([2 / 3] * 4, abs=1e-4)
    assert spread[4:] == pytest.approx([4 / 3] * 4, abs=1e-4)


def test_ranks_that_yield_their_cores_wait_only_for_the_slowest_core():
    """ZeRO-1's fences yield the core with more ranks than cores: with as many ranks on each
    core the wait is the slowest of the C cores' sums of p/C steps (spread 1/sqrt(p/C) as
    much); with a core a rank short, or a core each, the ranks' own wait."""
    w = Workload("synthetic", 64, (Layer("fc", "Gemm", 1e-3, 2e-3, 4096, 64),), 4096, 1,
                 0.0, "given", spread=(0.5, 1.5))
    two_cores = replace(Machine(), ranks_per_node=4, cores=2)
    assert yielding_wait(w, two_cores, 4) == pytest.approx(0.25 / math.sqrt(2) * 3e-3)
    assert yielding_wait(w, two_cores, 3) == w.sync_s(3)
    assert yielding_wait(w, two_cores, 2) == w.sync_s(2)
    zero = {pr.label: pr for pr in allreduce_costs(w, two_cores, 4)}
    assert zero["allreduce ZeRO-1 (shared memory)"].comm_s < zero["allreduce"].comm_s


def test_the_shared_exchange_reads_at_its_measured_rate():
    """Measured, the reads of what other ranks wrote move the gradients' slices and, in the
    next forward, the parameters the others stepped: twice (P-1)/P of the bytes at that rate;
    not measured, the slices at the link's beta (the MPI ping-pong's)."""
    link = Link(alpha=2e-6, beta=1e-10)
    assert shared_reduce(link, 2, 1e6, read_beta=4e-10) == pytest.approx(
        2 * 2e-6 + 2 * 0.5e6 * 4e-10)
    assert shared_reduce(link, 1, 1e6, read_beta=4e-10) == 0.0
    assert shared_reduce(link, 4, 1e6) == pytest.approx(2 * 2e-6 + 0.75e6 * 1e-10)
    measured = replace(Machine(), shared_read_beta=4e-10)
    slow = {pr.label: pr for pr in allreduce_costs(work(), measured, 2)}
    fast = {pr.label: pr for pr in allreduce_costs(work(), Machine(), 2)}
    label = "allreduce ZeRO-1 (shared memory)"
    assert slow[label].step_s > fast[label].step_s
    assert slow["allreduce"].step_s == fast["allreduce"].step_s


def test_a_synchronous_step_waits_for_its_slowest_rank():
    """Steps of 0.5 and 1.5 times the mean: the larger of two draws is 1.25 on average, so
    two ranks wait 25 % of the compute; one rank or no spread waits nothing; more ranks wait
    longer, up to the slowest step."""
    w = Workload("synthetic", 64, (Layer("fc", "Gemm", 1e-3, 2e-3, 4096, 64),), 4096, 1,
                 0.0, "given", spread=(0.5, 1.5))
    assert w.sync_s(1) == 0.0
    assert w.sync_s(2) == pytest.approx(0.25 * 3e-3)
    assert w.sync_s(2) < w.sync_s(8) < 0.5 * 3e-3
    assert Workload("s", 64, w.layers, 4096, 1, 0.0, "given").sync_s(8) == 0.0
    flat = allreduce_costs(Workload("s", 64, w.layers, 4096, 1, 0.0, "given"),
                            Machine(), 2)[0]
    assert allreduce_costs(w, Machine(), 2)[0].step_s == pytest.approx(
        flat.step_s + 0.25 * 3e-3)
    # averaging every k steps waits for the slowest rank's k steps, whose sums spread
    # sqrt(k) times one step's: per step, the wait over sqrt(k)
    steady = {pr.label: pr.step_s for pr in averaging_costs(
        Workload("s", 64, w.layers, 4096, 1, 0.0, "given"), Machine(), 2)}
    for pr in averaging_costs(w, Machine(), 2):
        every = int(pr.sets["distributed.average_every"])
        assert pr.step_s == pytest.approx(steady[pr.label] + 0.25 * 3e-3 / math.sqrt(every))


def test_ranks_sharing_cores_are_rescaled_to_the_ranks_a_strategy_keeps_busy():
    """Measured with 3 ranks stepping on 2 cores; Downpour's 2 workers (its server mostly
    waits) compute 1.5x as fast; at 2 measured ranks or fewer nothing changes."""
    w = Workload("s", 64, (Layer("fc", "Gemm", 3e-3, 6e-3, 4096, 64),), 4096, 1, 1.5e-3,
                 "given", ranks_measured=3)
    busy = w.busy(2, cores=2)
    assert busy.compute_s == pytest.approx(6e-3) and busy.update_s == pytest.approx(1e-3)
    assert w.busy(3, cores=2) is w
    assert Workload("s", 64, w.layers, 4096, 1, 0.0, "given", ranks_measured=2).busy(
        1, cores=2).compute_s == pytest.approx(9e-3)


def test_downpour_worker_pays_its_passes_and_transfers(cluster):
    """Without a progress thread a worker's push and fetch move their bytes in its own calls,
    and its step makes DOWNPOUR_PASSES passes over the gradients besides: pushing and fetching
    every 16 steps saves exactly those transfers and landings, when the servers keep up."""
    w = work(param_mb=4.0)
    preds = {pr.label: pr for pr in parameter_server_costs(w, cluster, 4)}
    every = preds["Downpour, 1 server(s), push/1 fetch/1"]
    rarely = preds["Downpour, 1 server(s), push/16 fetch/16"]
    n, link = w.param_bytes, cluster.intra
    saved = (2 - 2 / 16) * (n * cluster.copy_beta + n * link.beta + link.alpha)
    assert every.step_s - rarely.step_s == pytest.approx(saved, rel=1e-6)
    assert rarely.step_s > w.compute_s + w.update_s + DOWNPOUR_PASSES * n * cluster.copy_beta


def test_oversubscribed_keeps_every_rank_on_one_node_and_its_cores(cluster, tmp_path):
    """Four ranks on a 2-core node (the validation's runs here): one node, the intra link,
    ZeRO-1 in shared memory offered, busy ranks rescaled by the cores; saved and read back."""
    two = Machine(ranks_per_node=2, cores=2)
    assert two.link(4) == two.inter
    four = two.oversubscribed(4)
    assert four.nodes == 1 and four.link(4) == four.intra and four.cores_per_node == 2
    assert any("ZeRO-1" in pr.label for pr in allreduce_costs(work(), four, 4))
    assert not any("ZeRO-1" in pr.label for pr in allreduce_costs(work(), two, 4))
    assert load_machine(save_machine(four, tmp_path / "m.toml")) == four


def measured_pattern(ranks: int = 3) -> AsyncPattern:
    return AsyncPattern(ranks, step_s=6e-3, link=Link(4e-4, 1e-10), service_s=1e-3,
                        overlapped_step_s=5e-3, pass_s=1e-4, push_wait_s=3e-4,
                        fetch_wait_s=7e-4)


def test_asynchronous_workers_step_as_measured_in_their_pattern():
    """Measured at 3 ranks (every rank stepping: 4.5 ms; a worker in the blocking pattern
    6 ms, in the overlapped one 5 ms): the asynchronous server's worker computes 6 / 4.5 of
    the step; Downpour's 5 / 4.5, plus its measured passes and its waits once per push and
    per fetch. At 4 ranks, not measured, the computing ranks per core rescale it."""
    pattern = measured_pattern()
    w = Workload("s", 64, (Layer("fc", "Gemm", 1e-3, 2e-3, 4096, 64),), 4096, 1, 1.5e-3,
                 "given", ranks_measured=3, pattern=pattern, pattern_base_s=4.5e-3)
    m = Machine(ranks_per_node=3, cores=2, polled=pattern.link)
    preds = {pr.label: pr for pr in parameter_server_costs(w, m, 3)}
    ps = preds["asynchronous parameter server (1)"]
    assert ps.compute_s == pytest.approx(3e-3 * 6 / 4.5 + 4096 * m.copy_beta)
    assert ps.comm_s > 2 * pattern.link.message(4096)
    every = preds["Downpour, 1 server(s), push/1 fetch/1"]
    local = 4.5e-3 * 5 / 4.5 + (DOWNPOUR_PASSES + 2) * pattern.pass_s
    assert every.step_s == pytest.approx(local + 3e-4 + 7e-4 + 2 * m.intra.alpha)
    rarely = preds["Downpour, 1 server(s), push/1 fetch/16"]
    local = 4.5e-3 * 5 / 4.5 + (DOWNPOUR_PASSES + 1 + 1 / 16) * pattern.pass_s
    assert rarely.step_s == pytest.approx(local + 3e-4 + 7e-4 / 16
                                          + (1 + 1 / 16) * m.intra.alpha)
    assert w.as_worker(4, 3, 2) == w.busy(3, 2) and w.measured_pattern(4) is None


def test_a_measured_pattern_round_trips_through_the_machine_file(tmp_path):
    costs = RecipeCosts("abc", "planned", 8, {"fc": 1e-3}, {"fc": 2e-3}, 4e-3,
                        pattern=measured_pattern(2))
    machine = Machine(costs={"mnist_mlp": costs}, polled=costs.pattern.link)
    assert load_machine(save_machine(machine, tmp_path / "m.toml")) == machine


def test_a_pattern_of_one_message_size_fits_no_beta():
    """A network of 3 values sends the same size in both exchanges: alpha only, no division
    by the sizes' difference."""
    from meta.planner.async_pattern import _figures

    worker = (([1e-3], [3e-4], [3e-4]), ([1e-3], [1e-5], [1e-4], [2e-4]))
    server = (([1e-4], [1e-4]), ([], []))
    pattern = _figures(2, (3, 3), [worker], list(server))
    assert pattern.link.alpha == pytest.approx(1e-4) and pattern.link.beta == 0.0
    assert pattern.step_s == 1e-3
    assert (pattern.pass_s, pattern.push_wait_s, pattern.fetch_wait_s) == (1e-5, 1e-4, 2e-4)


def test_amsgrad_counts_a_third_slot_of_state():
    """Adam keeps m and v per parameter; with amsgrad also the running maximum of v."""
    from meta.planner.workload import make_workload
    from meta.recipe import AtLeast, make_recipe

    def slots(**optimizer):
        recipe = make_recipe("r", {"dataset": "synthetic", "model": {"name": "mlp",
                                                                     "hidden": [8]},
                                   "optimizer": {"name": "adam", **optimizer}}, {},
                             {"test_accuracy": AtLeast(0.0)})
        return make_workload(recipe, Machine()).state_slots

    assert (slots(), slots(amsgrad=True)) == (2, 3)
