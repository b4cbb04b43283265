"""ZeRO-2 (and the communicator's reduce-scatter and allgatherv): the checks of
``zero_checks.py`` at size 1 in-process and under ``mpiexec -n 2`` and ``-n 4``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv2.optimizers import (
    Optimizer,
    adam,
    chain,
    clip_by_global_norm,
    global_sum,
    masked,
    sgd,
    summed_over,
)
from meta.lv3 import SingleProcessCommunicator
from meta.lv3.strategies import STRATEGIES, strategy_class

from . import zero_checks

SCRIPT = str(Path(zero_checks.__file__))


@pytest.mark.parametrize("name", list(zero_checks.CHECKS))
def test_check_at_size_one(name: str) -> None:
    zero_checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_checks_under_mpiexec(mpirun: Callable[..., str], n: int) -> None:
    out = mpirun(n, [sys.executable, SCRIPT], timeout=300)
    for rank in range(n):
        assert f"rank {rank}/{n}: {len(zero_checks.CHECKS)} checks passed" in out, out


def test_registered_with_its_options() -> None:
    options = STRATEGIES["zero2"].options
    assert {"overlap", "bucket_bytes", "chunk_bytes"} <= set(options)


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_an_optimizer_that_is_not_elementwise_is_refused_in_one_line(name: str) -> None:
    by_name = Optimizer(masked(sgd(0.1), lambda n: n == "w"), {"w": np.zeros(3)})
    with pytest.raises(ComponentError) as err:
        strategy_class(name).check(by_name, SingleProcessCommunicator(), None)
    message = str(err.value)
    assert "\n" not in message and f"'{name}'" in message and "elementwise" in message
    clipped = Optimizer(chain(clip_by_global_norm(1.0), sgd(0.1)), {"w": np.zeros(3)})
    strategy_class(name).check(clipped, SingleProcessCommunicator(), None)  # taken


def test_a_clip_sees_the_norm_summed_over_the_shards() -> None:
    """A shard steps inside ``summed_over`` (the strategy's sum over its ranks): the clip
    scales by the whole model's norm, not the shard's."""
    clip = clip_by_global_norm(1.0)
    shard = {"": np.array([0.6, 0.0])}  # alone: norm 0.6, not clipped
    assert clip.shardable and not clip.elementwise
    np.testing.assert_array_equal(clip.update(shard, (), {})[0][""], [0.6, 0.0])
    with summed_over(lambda partial: partial + 0.64):  # the other shards' squares: norm 1.0
        np.testing.assert_array_equal(clip.update(shard, (), {})[0][""], [0.6, 0.0])
    with summed_over(lambda partial: partial + 3.64):  # norm 2: halved
        np.testing.assert_allclose(clip.update(shard, (), {})[0][""], [0.3, 0.0])
    assert global_sum(2.0) == 2.0  # outside: the shard is the whole


def test_zero3_steps_on_gradients_a_caller_computed() -> None:
    """``Zero3.step(grads)`` (the backward run elsewhere) equals the bare optimizer, and the
    graph holds no values between steps (zero-memory placeholders) until ``finish``."""
    from meta.lv1 import ReferenceExecutor, mlp
    from meta.lv3.data_parallel.zero3 import Zero3

    graph, twin = mlp((1, 4, 4), hidden=(5,), classes=3, seed=2), mlp((1, 4, 4), hidden=(5,),
                                                                        classes=3, seed=2)
    bare = Optimizer(sgd(0.1, momentum=0.9), twin.parameters)
    zero = Zero3(Optimizer(sgd(0.1, momentum=0.9), graph.parameters),
                 SingleProcessCommunicator(), graph, lambda g: ReferenceExecutor(g), groups=2)
    rng = np.random.default_rng(0)
    for _ in range(3):
        grads = {k: rng.standard_normal(v.shape).astype(v.dtype)
                 for k, v in twin.parameters.items()}
        bare.step(grads)
        zero.step(grads)
    assert all(v.strides == (0,) * v.ndim for v in graph.parameters.values())
    zero.finish()
    for k, v in twin.parameters.items():
        np.testing.assert_array_equal(graph.parameters[k], v, err_msg=k)


@pytest.mark.mpi
@pytest.mark.slow
def test_a_killed_rank_ends_a_zero3_job_with_the_one_line(tmp_path: Path, mnist_dir) -> None:
    """As under the other strategies (tests/e2e/test_no_hang.py): rank 1 SIGKILLed during
    ZeRO-3 training (each rank under a shell, mpiexec without auto-cleanup) ends the job
    within 10 s, the survivor naming it in one line."""
    import socket

    from tests.e2e.test_no_hang import DIED, NO_HANG_S, kill_during_training, wrapped_job

    cmd = wrapped_job("mnist_mlp.py", 2, tmp_path / "out", ignore_usr1=True)
    cmd[-1] = cmd[-1].replace("'epochs=100'", "'epochs=100' '--set' 'distributed=zero3'")
    kill = kill_during_training(cmd, 1)
    assert kill.rc != 0 and not kill.hung and kill.seconds < NO_HANG_S, kill.out
    assert DIED.findall(kill.out) == [f"meta: rank 1 (pid {kill.pid} on "
                                      f"{socket.gethostname()}) died; ending this job"], kill.out
    assert "Traceback" not in kill.out, kill.out


# Full-batch Adam on 64 synthetic examples (one step an epoch at any rank count: the same
# examples' mean gradient at 4, 2 and 1 ranks), on the planned executor (its groups' plans bound
# to the slots, evaluations copying the gathered model into them). The event gathers what a run
# begins training from out of its ZeRO-3 shards (a collective on every rank); rank 0 writes it.
CHECKPOINT_RECIPE = '''
import json
from pathlib import Path

import numpy as np

from meta.lv2 import Event, register_event
from meta.lv2.checkpoint import flatten_tree
from meta.run.recipe import AtLeast


@register_event("shard_probe")
class ShardProbe(Event):
    """At train begin: the model taken into this run's ZeRO-3 shards and gathered back out
    of them, with the optimizer state; rank 0 writes them to loaded.npz and loaded.json."""

    options = {}

    def on_train_begin(self, trainer):
        executor = trainer.executor
        executor.dematerialize()
        executor.materialize()
        strategy = executor.strategy
        arrays = {f"param/{k}": np.array(v) for k, v in executor.graph.parameters.items()}
        spec = flatten_tree(strategy._gather_state(), arrays, "state")
        if strategy.comm.is_root:
            np.savez(Path(trainer.output_dir) / "loaded.npz", **arrays)
            (Path(trainer.output_dir) / "loaded.json").write_text(json.dumps(spec))


FIXED = {"dataset": "synthetic", "hidden": [16, 8], "optimizer": "adam",
         "executor": "planned", "events": [{"name": "shard_probe"}]}
MUTABLE = {"epochs": 2, "train_examples": 64, "test_examples": 16, "batch_size": 64,
           "lr": 0.01, "seed": 3, "distributed": "allreduce"}
METRICS = {"test_accuracy": AtLeast(0.0)}
'''


@pytest.mark.mpi
@pytest.mark.slow
def test_a_zero3_checkpoint_from_4_ranks_resumes_at_2_and_in_one_process(
        tmp_path: Path) -> None:
    """``meta run --set distributed=zero3`` under ``mpiexec -n 4`` saves its checkpoint;
    ``--resume`` of it at ``-n 2`` and in one process shards it again, and what each run's
    shards hold when it begins training (gathered back) is the saved parameters and optimizer
    state, bit for bit; each trains on (Adam's step count continues) to the same weights."""
    import json
    import shutil

    from meta.lv2.checkpoint import flatten_tree, load_checkpoint
    from tests.launch import clean_env, find_mpiexec, run_command

    recipe = tmp_path / "zero3_resume.py"
    recipe.write_text(CHECKPOINT_RECIPE)
    env = clean_env({"OMP_NUM_THREADS": "1"})
    meta = [sys.executable, "-m", "meta.cli", "run", str(recipe), "--quiet", "--no-export",
            "--set", "distributed=zero3"]
    mpiexec = str(find_mpiexec())
    run_command([mpiexec, "-n", "4", *meta, "--output-dir", str(tmp_path / "four")], env,
                timeout=300)
    saved = load_checkpoint(tmp_path / "four" / "checkpoint.npz")
    saved_arrays: dict[str, np.ndarray] = {}
    saved_spec = flatten_tree(saved.optimizer["state"], saved_arrays, "state")
    finals = {}
    for where, launch in (("two", [mpiexec, "-n", "2"]), ("one", [])):
        shutil.copytree(tmp_path / "four", tmp_path / where)
        out = run_command([*launch, *meta, "--set", "epochs=3", "--resume", "--output-dir",
                           str(tmp_path / where)], env, timeout=300)
        assert "resuming from" in out and "at epoch 3, step 2" in out, out
        loaded = np.load(tmp_path / where / "loaded.npz")
        for name, value in saved.params.items():
            assert np.array_equal(loaded[f"param/{name}"], value), (where, name)
        assert json.loads((tmp_path / where / "loaded.json").read_text()) == saved_spec, where
        for key, value in saved_arrays.items():  # Adam's moments, from the new shards
            assert np.array_equal(loaded[key], value), (where, key)
        final = load_checkpoint(tmp_path / where / "checkpoint.npz")
        assert final.position["step"] == 3 and final.optimizer["state"][0]["t"] == 3, where
        finals[where] = final.params
    for name in saved.params:  # the same full-batch step, summed in another order
        np.testing.assert_allclose(finals["two"][name], finals["one"][name], rtol=0,
                                   atol=1e-6, err_msg=name)
        assert not np.array_equal(finals["two"][name], saved.params[name]), name


def test_zero3_slots_never_hold_two_groups_live_together() -> None:
    """A chain of groups alternates two slots; a last group that also reads the first
    (a head tied to the embedding) puts the first in a slot of its own, since it is live
    beside the last two; groups live together (one stage's and the next's) never share."""
    from meta.lv3.data_parallel.zero3 import slot_colors

    assert slot_colors([{0}, {1}, {2}, {3}, {4}], 5) == [0, 1, 0, 1, 0]
    needs = [{0}, {1}, {2}, {3, 0}]
    colors = slot_colors(needs, 4)
    assert colors == [0, 1, 2, 1]
    for s in range(len(needs) - 1):
        window = sorted(needs[s] | needs[s + 1])
        assert len({colors[g] for g in window}) == len(window), window


def _planned_workload(**options):
    from meta.lv1 import PlannedExecutor, gpt
    from meta.lv3.workload import Workload

    graph = gpt((8,), classes=11, layers=2, heads=2, width=16, seed=1)
    executor = PlannedExecutor(graph, **options).train()
    return Workload(executor, {"input": "input", "labels": "labels", "logits": "logits",
                               "loss": "loss"}, None, 4, 0, False, 1)


def test_zero3_groups_run_with_every_option_of_the_runs_executor() -> None:
    """The executor maker passes every option the run's executor declares: a bf16 run's
    layer groups run bf16 (their plans' placement says "onednn bf16"), not float32."""
    from meta.lv1.plan import runtime
    from meta.lv1.plan.precision import effective
    from meta.lv3.data_parallel.zero3 import Zero3

    if not runtime.available():
        pytest.skip("no planned executor here")
    workload = _planned_workload(precision="bf16", profile=True, free_intermediates=False)
    graph = workload.graph
    zero = Zero3.from_recipe(Optimizer(adam(1e-3), graph.parameters),
                             SingleProcessCommunicator(), workload, groups=2)
    for ex in zero.executor.executors:
        assert (ex.precision, ex.profile, ex.free_intermediates) == ("bf16", True, False)
    feeds = {"input": np.arange(16).reshape(2, 8) % 11, "labels": np.ones((2, 8), np.int64)}
    zero.step_with(zero.executor.train(), feeds)
    places = set(zero.executor.placement().values())
    assert ("onednn bf16" in places) == (effective("bf16") == "bf16"), places


def test_zero3_planned_slots_give_their_pages_back_between_steps() -> None:
    """On the planned executor the slots keep their addresses (the plans stay bound to them)
    but give their pages back after each step: they read as zeros (``MADV_DONTNEED``) until
    the next gather, and the next step reads the gathered values, not the zeros."""
    from meta.lv1.plan import runtime
    from meta.lv3.data_parallel.zero3 import Zero3

    if not runtime.available():
        pytest.skip("no planned executor here")
    workload = _planned_workload()
    zero = Zero3.from_recipe(Optimizer(adam(1e-3), workload.graph.parameters),
                             SingleProcessCommunicator(), workload, groups=2)
    ex = zero.executor.train()
    feeds = {"input": np.arange(16).reshape(2, 8) % 11, "labels": np.ones((2, 8), np.int64)}
    losses = [float(zero.step_with(ex, feeds)["loss"])]
    slots = [s.ctypes.data for s in ex.param_slots + ex.grad_slots]
    assert ex.param_pages and ex.grad_pages
    assert all(not s.any() for s in ex.param_slots + ex.grad_slots)
    assert zero.param_shard.any()
    losses.append(float(zero.step_with(ex, feeds)["loss"]))
    assert [s.ctypes.data for s in ex.param_slots + ex.grad_slots] == slots
    assert losses[1] < losses[0], losses


def test_stages_that_cannot_recompute_refuse_it_in_one_line() -> None:
    """A strategy whose parts run as stages (no recomputation there) refuses ``recompute``
    rather than dropping it; ZeRO-3 takes it (it recomputes its groups)."""
    from meta.lv1.plan import runtime
    from meta.lv3.data_parallel.zero3 import Zero3

    if not runtime.available():
        pytest.skip("no planned executor here")
    workload = _planned_workload(recompute="blocks")
    with pytest.raises(ComponentError, match=r"'pipeline' runs the graph's parts as stages, "
                                             r"which do not recompute .*recompute='blocks'"):
        workload.executor_maker("pipeline")
    zero = Zero3.from_recipe(Optimizer(adam(1e-3), workload.graph.parameters),
                             SingleProcessCommunicator(), workload, groups=2)
    assert zero.executor.recompute
    assert all(ex.recompute is None for ex in zero.executor.executors)


def test_zero3_refuses_to_recompute_a_graph_that_draws_random_numbers() -> None:
    from meta.lv1 import ReferenceExecutor, gpt
    from meta.lv3.data_parallel.zero3 import Zero3

    graph = gpt((8,), classes=11, layers=1, heads=2, width=16, seed=1, dropout=0.1)
    with pytest.raises(ComponentError, match=r"zero3' with recompute='blocks': node .*"
                                             r"\(Dropout\) draws random numbers"):
        Zero3(Optimizer(sgd(0.1), graph.parameters), SingleProcessCommunicator(), graph,
              lambda g: ReferenceExecutor(g), groups=2, recompute="blocks")


def test_a_recipes_zero2_on_the_planned_executor_runs_through_the_groups(capsys) -> None:
    """On an executor whose plans bind their gradient arrays, ZeRO-2 runs through ZeRO-3's
    groups with the parameters whole (no whole-model gradient buffer); elsewhere as before."""
    import dataclasses

    from meta.lv1 import ReferenceExecutor
    from meta.lv1.plan import runtime
    from meta.lv3.data_parallel.zero import Zero2
    from meta.lv3.data_parallel.zero3 import Zero2Grouped

    if not runtime.available():
        pytest.skip("no planned executor here")
    workload = _planned_workload()
    params = workload.graph.parameters
    zero = Zero2.from_recipe(Optimizer(adam(1e-3), params), SingleProcessCommunicator(),
                             workload, bucket_bytes=4096, overlap=True)
    assert type(zero) is Zero2Grouped and zero.name == "zero2"
    assert "bucket_bytes=4096 do not apply" in capsys.readouterr().err  # said, not dropped
    assert zero.executor.colors == list(range(len(zero.groups)))  # every group its own slot
    reference = dataclasses.replace(workload, executor=ReferenceExecutor(workload.graph))
    assert type(Zero2.from_recipe(Optimizer(adam(1e-3), params), SingleProcessCommunicator(),
                                  reference)) is Zero2


def test_a_recipe_trains_zero2_on_the_planned_executor_as_allreduce(tmp_path: Path) -> None:
    """The recipe path of ``Zero2Grouped`` (one process): two epochs with their evaluations
    and epoch-end checkpoints, the same weights as allreduce's."""
    import io

    from meta.lv1.plan import runtime
    from meta.run.recipe import AtMost, make_recipe
    from meta.run.runner import run_recipe
    from tests.test_training_features import _data

    if not runtime.available():
        pytest.skip("no planned executor here")
    params = {}
    for dist in ("allreduce", "zero2"):
        recipe = make_recipe("z2", {
            "dataset": {"name": "arrays", "path": _data(tmp_path), "test_fraction": 0.2,
                        "normalize": False},
            "model": {"name": "mlp", "hidden": [16]}, "executor": "planned",
            "optimizer": {"name": "adam", "lr": 0.01}, "distributed": dist},
            {"epochs": 2, "batch_size": 64, "seed": 0}, {"test_loss": AtMost(1e9)})
        params[dist] = run_recipe(recipe, SingleProcessCommunicator(), stream=io.StringIO(),
                                  progress=False, export_onnx=False,
                                  output_dir=tmp_path / dist).parameters
    for k, v in params["allreduce"].items():
        np.testing.assert_allclose(params["zero2"][k], v, rtol=0, atol=1e-6, err_msg=k)
