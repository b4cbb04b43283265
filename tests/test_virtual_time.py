"""The virtual-time simulator (meta.planner.virtual_time): its clocks give hand-computed
schedules, stragglers delay the worker they are drawn for, its execution trains and refuses
a schedule the workers cannot follow, ``meta plan --simulate`` errors are one line; and (slow,
under mpiexec) a real Downpour run's recorded schedule ends with that run's weights bit for
bit."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from meta.lv3.comm.costmodel import Link
from meta.planner.virtual_time import (
    FETCH,
    PUSH,
    Schedule,
    SimulationError,
    Timing,
    execute_downpour,
    schedule_async,
    schedule_downpour,
    simulate,
    staleness,
)
from tests.launch import clean_env, find_mpiexec, run_command

RECIPE = """
    from meta.run.recipe import AtLeast
    FIXED = {"dataset": {"name": "synthetic", "train_examples": 384, "test_examples": 128,
                         "input_shape": [16]},
             "hidden": [16], "optimizer": "adagrad"}
    MUTABLE = {"distributed": {"name": "downpour", "n_fetch": 2, "n_push": 1,
                               "warm_start_steps": 2},
               "epochs": 2, "batch_size": 16, "lr": 0.05}
    METRICS = {"test_accuracy": AtLeast(0.5)}
"""


def _approx(schedule: Schedule) -> list[tuple[int, int, float]]:
    return [(w, tag, round(at, 9)) for w, tag, at in schedule.server]


def test_one_downpour_worker_follows_the_hand_computed_schedule() -> None:
    # compute 1 s, local/server update 0.5 s, 0.1 s latency, no bandwidth term
    t = Timing(compute_s=1.0, update_s=0.5, link=Link(alpha=0.1, beta=0.0))
    s = schedule_downpour(t, [2])
    # step 0: gradient until 1.0; the step-0 fetch arrives at 1.1, answered by 1.2; the local
    # update until 1.7; push and fetch arrive at 1.8, the push applied until 2.3, then the
    # fetch, answered by 2.4, before step 1's gradient ends (2.7): it lands early
    assert _approx(s) == [(0, FETCH, 1.1), (0, PUSH, 1.8), (0, FETCH, 2.3), (0, PUSH, 3.3),
                          (0, FETCH, 3.8)]
    assert s.early == [[1]] and s.order == [0, 0]


def test_two_downpour_workers_one_twice_as_slow_follow_the_hand_computed_schedule() -> None:
    t = Timing(compute_s=1.0, update_s=0.0, link=Link(alpha=0.0, beta=0.0))
    s = schedule_downpour(t, [2, 2], slow={1: 2.0})
    # t=1: worker 0's step-0 fetch, its push and next fetch; t=2: worker 1's step-0 fetch
    # (its clock resumes before worker 0's, scheduled earlier), worker 0's second push and
    # fetch (its answer from t=1 landed early), worker 1's first push and fetch; t=4: worker
    # 1's second (its t=2 answer landed early)
    assert s.server == [(0, FETCH, 1.0), (0, PUSH, 1.0), (0, FETCH, 1.0), (1, FETCH, 2.0),
                        (0, PUSH, 2.0), (0, FETCH, 2.0), (1, PUSH, 2.0), (1, FETCH, 2.0),
                        (1, PUSH, 4.0), (1, FETCH, 4.0)]
    assert s.early == [[1], [1]] and s.finish_s == 4.0


def test_a_fetch_not_back_in_time_is_awaited_not_landed_early() -> None:
    # the server's update (2 s) outlasts the next gradient (1 s): no early landing
    t = Timing(compute_s=1.0, update_s=2.0, link=Link(alpha=0.0, beta=0.0))
    assert schedule_downpour(t, [3]).early == [[]]
    # without a push ahead of it (n_push=2: none at step 0) the fetch is answered at once
    assert schedule_downpour(t, [3], n_fetch=1, n_push=2).early == [[1]]


def test_async_server_order_is_deterministic_and_matches_the_clocks() -> None:
    t = Timing(compute_s=1.0, update_s=0.25, link=Link(alpha=0.1, beta=0.0))
    s = schedule_async(t, [2, 2])
    # both pushes arrive at 1.1 (worker 0 first on the tie); the server is busy until 1.35
    # with worker 0's, answers at 1.45; worker 1's is applied 1.35..1.6, answered at 1.7
    assert _approx(s) == [(0, PUSH, 1.1), (1, PUSH, 1.35), (0, PUSH, 2.55), (1, PUSH, 2.8)]
    assert _approx(schedule_async(t, [2, 2])) == _approx(s)
    assert staleness(s) == 0.75  # every push but the first is one update behind


def test_bandwidth_queues_pushes_at_the_server() -> None:
    # 1 s to move the parameters: pushes sent together are received one after the other
    t = Timing(compute_s=1.0, update_s=0.0, link=Link(alpha=0.0, beta=1.0), nbytes=1)
    s = schedule_async(t, [1, 1, 1])
    assert _approx(s) == [(0, PUSH, 2.0), (1, PUSH, 3.0), (2, PUSH, 4.0)]


def test_a_slow_worker_is_the_one_delayed() -> None:
    t = Timing(compute_s=1.0, update_s=0.0, link=Link(alpha=0.0, beta=0.0))
    s = schedule_async(t, [4, 4, 4], slow={2: 3.0})
    times = {w: [at for v, _, at in s.server if v == w] for w in range(3)}
    assert times[0] == times[1] == [1.0, 2.0, 3.0, 4.0]
    assert times[2] == [3.0, 6.0, 9.0, 12.0]
    assert s.order[:8].count(2) == 1  # by t = 4 it pushed once, the others four times each


def test_lognormal_stragglers_are_seeded_per_worker() -> None:
    t = Timing(compute_s=1.0, update_s=0.0, link=Link(0.0, 0.0), sigma=0.5, seed=3)
    draws = t.compute()
    a = [next(draws(0)) for _ in range(1)] + [x for x, _ in zip(draws(0), range(200))]
    assert a[0] == a[1] and len(set(a)) > 100  # a worker's draws repeat with its seed
    assert next(draws(1)) != a[0]  # another worker draws others
    assert np.median(a) == pytest.approx(1.0, rel=0.2)  # median 1: the nominal step
    assert schedule_downpour(t, [5, 5]).server == schedule_downpour(t, [5, 5]).server
    other = Timing(1.0, 0.0, Link(0.0, 0.0), sigma=0.5, seed=4)
    assert schedule_downpour(other, [5, 5]).server != schedule_downpour(t, [5, 5]).server


def test_warm_start_holds_the_other_workers_back() -> None:
    t = Timing(compute_s=1.0, update_s=0.0, link=Link(alpha=0.0, beta=0.0))
    s = schedule_downpour(t, [4, 4], warm_start_steps=3)
    first = next(j for j, (w, _, _) in enumerate(s.server) if w == 1)
    assert [w for w, tag, _ in s.server[:first] if tag == PUSH] == [0, 0, 0]
    with pytest.raises(SimulationError, match="warm_start_steps=5 is more than worker 0's 4"):
        schedule_downpour(t, [4, 4], warm_start_steps=5)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory):
    from meta.run.recipe import load_recipe

    path = tmp_path_factory.mktemp("vt") / "downpour_synthetic.py"
    path.write_text(textwrap.dedent(RECIPE))
    return load_recipe(str(path))


def test_timing_comes_from_the_machine_description(recipe) -> None:
    from dataclasses import replace

    from meta.planner.machine import Machine
    from meta.planner.virtual_time import timing_for
    from meta.planner.workload import make_workload

    machine = replace(Machine(), ranks_per_node=4)
    work = make_workload(recipe, machine)
    inside = timing_for(recipe, machine, 3, sigma=0.3, seed=7)  # 3 workers + 1 server: a node
    assert inside.link == machine.intra and inside.nbytes == work.param_bytes
    assert inside.compute_s == pytest.approx(work.compute_s) and inside.update_s == \
        work.update_s and (inside.sigma, inside.seed, inside.servers) == (0.3, 7, 1)
    assert timing_for(recipe, machine, 4).link == machine.inter  # 5 ranks: two nodes
    assert timing_for(recipe, machine, 3, compute_s=0.25).compute_s == 0.25
    sharded = recipe.with_overrides({"distributed.servers": 4})
    assert timing_for(sharded, machine, 3).servers == 4


def test_simulated_downpour_trains(recipe) -> None:
    t = Timing(compute_s=1e-3, update_s=1e-4, link=Link(1e-5, 1e-9), nbytes=1200,
               sigma=0.3)
    curve = simulate(recipe, 4, t, points=4)
    times = [at for at, *_ in curve.points]
    assert times == sorted(times) and times[-1] == pytest.approx(curve.finish_s)
    assert curve.points[-1][1] == 4 * 2 * 6  # 4 workers, 2 epochs of 96 samples / 16
    assert curve.points[-1][3] > curve.points[0][3] + 0.2  # it learned
    assert curve.staleness > 0


def test_a_blocking_fetch_is_refused_not_simulated_as_nonblocking(recipe) -> None:
    """The simulator follows Downpour's nonblocking client: a recipe with blocking_fetch is
    refused in one line rather than simulated as something it is not."""
    t = Timing(compute_s=1e-3, update_s=1e-4, link=Link(1e-5, 1e-9), nbytes=1200)
    with pytest.raises(SimulationError, match="blocking_fetch; the simulator follows the "
                                              "nonblocking client only"):
        simulate(recipe.with_overrides({"distributed.blocking_fetch": True}), 2, t, points=2)


def test_the_async_server_is_simulated_too(recipe) -> None:
    async_ps = recipe.with_overrides({"distributed": "async_parameter_server"})
    t = Timing(compute_s=1e-3, update_s=1e-4, link=Link(1e-5, 1e-9), nbytes=1200)
    curve = simulate(async_ps, 3, t, points=2)
    assert curve.strategy == "async_parameter_server" and curve.points[-1][1] == 3 * 2 * 8


def test_a_schedule_the_workers_cannot_follow_is_refused(recipe, tmp_path: Path) -> None:
    from meta.planner.virtual_time import _team

    t = Timing(compute_s=1e-3, update_s=1e-4, link=Link(1e-5, 1e-9))
    good = schedule_downpour(t, [12, 12], n_fetch=2, warm_start_steps=2)
    bad = list(good.server)
    j = next(j for j, (w, tag, _) in enumerate(bad) if tag == PUSH)
    bad[j] = (bad[j][0], FETCH, bad[j][2])  # a push recorded as a fetch
    team, _ = _team(recipe, 2, str(tmp_path))
    with pytest.raises(SimulationError, match=f"message {j} of the server is a fetch of "
                                              f"worker 0, which sent a push"):
        execute_downpour(Schedule("downpour", 2, bad, good.early, 2, 1, 2), team)
    with pytest.raises(SimulationError, match="the schedule has 3 workers, the run 2"):
        execute_downpour(Schedule("downpour", 3, good.server), team)


@pytest.mark.parametrize("argv, shown", [
    (["--simulate", "8,x"], "--simulate '8,x': expected worker counts"),
    (["--simulate", "0"], "worker counts must be >= 1"),
    (["--simulate", "2", "--sigma", "-1"], "--sigma -1.0: must be a finite number >= 0"),
    (["--simulate", "2", "--set", "distributed=allreduce"], "distributed with 'allreduce'"),
])
def test_plan_simulate_errors_are_one_line(recipe, capsys, argv, shown) -> None:
    from meta.cli import main

    assert main(["plan", str(recipe.path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and shown in err, err


def test_plan_simulate_prints_accuracy_against_time(recipe, capsys, tmp_path: Path) -> None:
    from meta.cli import main

    png = tmp_path / "vt.png"
    assert main(["plan", str(recipe.path), "--simulate", "2,4", "--points", "3",
                 "--compute-ms", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "N = 2 workers (downpour, 1 server)" in out and "N = 4 workers" in out
    assert "compute 2 ms/step" in out and png.stat().st_size > 1000


@pytest.mark.parametrize("schedule, shown", [
    (None, "no Downpour schedule recorded"),
    ({"n_fetch": 1, "n_push": 1, "warm_start_steps": 0, "server": [[0, 1]], "early": [[]]},
     "field 'schedule' is damaged"),
], ids=["none", "damaged"])
def test_replay_of_a_downpour_record_without_a_usable_schedule_is_one_line(
        tmp_path: Path, capsys, schedule, shown) -> None:
    from meta.cli import main

    rec = {"format": 1, "strategy": "downpour", "resumed": False,
           "recipe_file": str(tmp_path / "r.py"), "mutable": {}, "definitions": {},
           "threads": 1, "ranks": 2, "workers": [0], "order": [0], "final_sha256": {},
           **({"schedule": schedule} if schedule else {})}
    (tmp_path / "replay.json").write_text(json.dumps(rec))
    assert main(["replay", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and shown in err and "replay.json" in err, err


# -- a real run, fed back ------------------------------------------------------------------

def _meta(*args: str) -> list[str]:
    return [sys.executable, "-m", "meta.cli", *args]


@pytest.mark.slow
@pytest.mark.mpi
def test_a_real_downpour_run_is_reproduced_bit_for_bit(tmp_path: Path) -> None:
    """mpiexec -n 4: 1 server + 3 workers of recipes/mnist_downpour.py, shortened; fetches
    every 3 steps (so some land early, before the local step) and pushes every 2."""
    from meta.run.replay import replay

    out = tmp_path / "run"
    run_command([str(find_mpiexec()), "-n", "4",
                 *_meta("run", "recipes/mnist_downpour.py", "--quiet", "--output-dir",
                        str(out), "--set", "train_samples=3000", "--set", "epochs=1",
                        "--set", "distributed.warm_start_steps=5", "--set",
                        "distributed.n_fetch=3", "--set", "distributed.n_push=2")],
                clean_env({"OMP_NUM_THREADS": "1"}), timeout=120,
                expect_rc=None)  # 1: the shortened run misses the recipe's accuracy
    rec = json.loads((out / "replay.json").read_text())
    schedule = Schedule.from_record(rec, out)
    assert rec["strategy"] == "downpour" and rec["workers"] == [0, 1, 2]
    assert schedule.workers == 3 and schedule.order == [rec["workers"][w] for w in
                                                        schedule.order]
    assert len(schedule.order) == 3 * 8  # 16 steps per worker, a push every 2
    done = replay(out)  # Downpour: through execute_downpour
    assert done.identical, done.differing
    # two pushes of different workers the other way round end elsewhere: the order is what
    # is reproduced
    server = rec["schedule"]["server"]
    j = next(j for j in range(len(server) - 1) if server[j][1] == server[j + 1][1] == PUSH
             and server[j][0] != server[j + 1][0])
    server[j], server[j + 1] = server[j + 1], server[j]
    other = tmp_path / "swapped"
    other.mkdir()
    (other / "replay.json").write_text(json.dumps(rec))
    assert not replay(other).identical
