"""MPI checks of the ZeRO strategies (``meta.lv3.data_parallel.zero``), written once.

pytest runs them in-process at size 1; under MPI every rank runs them as a script:

    mpiexec -n 4 python tests/lv3/data_parallel/zero_checks.py [check_name ...]
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv2.optimizers import Optimizer, adam, chain, clip_by_global_norm, sgd
from meta.lv3 import Communicator, make_strategy
from meta.lv3.flat import shard_bounds
from tests import checks

STEPS = 20
RULES = {"momentum": lambda: sgd(0.05, momentum=0.9),
         "adam": lambda: adam(0.01, weight_decay=1e-3),
         # every step clipped (the norms are above 0.01): the norm is the whole model's,
         # summed over the ranks' shards (meta.lv2.optimizers.summed_over)
         "clipped": lambda: chain(clip_by_global_norm(0.01), adam(0.01))}


def check_reduce_scatter_and_allgatherv(comm: Communicator) -> None:
    """Uneven counts (one rank's may be empty): each rank gets the sum of its part; the
    in-place allgather leaves every rank every rank's part."""
    r, p = comm.rank, comm.size
    n = 2 * p + 1
    counts = [hi - lo for lo, hi in shard_bounds(n, p)]
    if p > 1:  # the last rank receives nothing
        counts[-1], counts[0] = 0, counts[0] + counts[-1]
    send = np.arange(n, dtype=np.float32) * (r + 1)
    lo = sum(counts[:r])
    recv = np.full(counts[r], -1, np.float32)
    comm.waitall([comm.ireduce_scatter(send, recv, counts)])
    np.testing.assert_array_equal(recv, np.arange(lo, lo + counts[r]) * p * (p + 1) / 2)
    buf = np.full(n, -1.0)
    buf[lo:lo + counts[r]] = np.arange(lo, lo + counts[r])
    comm.waitall([comm.iallgatherv(buf, counts)])
    np.testing.assert_array_equal(buf, np.arange(n))


def _batches(comm: Communicator, model: str = "mlp") -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(100 + comm.rank)  # each rank its own shard of the data
    if model == "gpt":
        return [{"input": rng.integers(0, 11, (3, 8)), "labels": rng.integers(0, 11, (3, 8))}
                for _ in range(STEPS)]
    return [{"input": rng.standard_normal((6, 1, 4, 4)).astype(np.float32),
             "labels": rng.integers(0, 3, 6)} for _ in range(STEPS)]


def _train(comm: Communicator, name: str, rule: str, planned: bool, **options
           ) -> tuple[list[float], dict[str, np.ndarray], object]:
    """20 steps of a small MLP under strategy ``name``: the losses (mean over ranks), the
    final parameters and the strategy."""
    from meta.lv1 import PlannedExecutor, ReferenceExecutor, mlp

    graph = mlp((1, 4, 4), hidden=(13, 7), classes=3, seed=1)
    strategy = make_strategy(name, Optimizer(RULES[rule](), graph.parameters), comm, **options)
    executor = (PlannedExecutor if planned else ReferenceExecutor)(graph).train()
    losses = []
    for feeds in _batches(comm):
        values = strategy.step_with(executor, feeds)
        loss = np.array([float(values["loss"])])
        comm.allreduce(loss)
        losses.append(float(loss[0]) / comm.size)
    strategy.timeline.end_steps()
    strategy.finish()
    return losses, {k: v.copy() for k, v in graph.parameters.items()}, strategy


def check_zero2_equals_allreduce(comm: Communicator) -> None:
    """20 steps under ZeRO-2 equal allreduce's (losses and parameters within 1e-6, float32),
    with SGD-momentum and Adam, overlapped with the planned executor's backward (buckets
    smaller than a shard: several reduce-scatters a step, some across two ranks' shards) and
    after the reference executor's; every rank the same parameters; the gathered state equals
    allreduce's."""
    from meta.lv1.plan import runtime

    for rule in RULES:
        for planned in ((False, True) if runtime.available() else (False,)):
            ref_losses, ref_params, ref = _train(comm, "allreduce", rule, planned,
                                                 shared_memory=False)
            losses, params, zero = _train(comm, "zero2", rule, planned, bucket_bytes=1024,
                                         chunk_bytes=2048)
            np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-6,
                                       err_msg=f"{rule} planned={planned}")
            for k in ref_params:
                np.testing.assert_allclose(params[k], ref_params[k], rtol=0, atol=1e-6,
                                           err_msg=f"{rule} planned={planned} {k}")
                gathered = comm.allgather(np.ascontiguousarray(params[k]))
                assert all(np.array_equal(g, gathered[0]) for g in gathered), k
            if planned and comm.size > 1:
                assert zero.hook.used
                calls = [e for e in zero.timeline.background_events
                         if e[0] == "reduce-scatter (overlapped)"]
                assert len(calls) >= 2 * STEPS, len(calls)
            if not comm.is_root:  # rank 0 writes checkpoints: it alone keeps the whole state
                assert zero.state is None
                continue
            ours, theirs = _arrays(zero.state_dict()["state"]), _arrays(ref.state_dict()["state"])
            assert len(ours) == len(theirs) > 0, rule
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=rule)


def check_zero2_state_resumes_at_another_rank_count(comm: Communicator) -> None:
    """A state saved by ZeRO-2 (whole, per parameter name) loads into one process's plain
    optimizer and back into ZeRO-2, which then steps as the plain optimizer does."""
    shapes = {"w": (7, 5), "b": (5,), "v": (3,)}
    start = {k: np.random.default_rng(3).standard_normal(s) for k, s in shapes.items()}
    grads = [{k: np.random.default_rng(10 + i).standard_normal(s) for k, s in shapes.items()}
             for i in range(6)]
    zero = make_strategy("zero2", Optimizer(adam(0.01), {k: v.copy() for k, v in start.items()}),
                         comm)
    plain = Optimizer(adam(0.01), {k: v.copy() for k, v in start.items()})
    for g in grads[:3]:  # every rank the same gradients: the mean is each one
        zero.step(g)
        plain.step(g)
    if comm.is_root and comm.size > 1:
        try:
            zero.state_dict()
        except RuntimeError as err:  # stale until gathered: refused, not saved wrong
            assert "last gathered at step -1, not at step 3" in str(err), err
        else:
            raise AssertionError("a stale sharded state was handed out")
    zero.finish()
    saved = comm.bcast_obj(zero.state_dict() if comm.is_root else None)  # as read from a file
    resumed = Optimizer(adam(0.01), {k: v.copy() for k, v in zero.params.items()})
    resumed.load_state_dict(saved)  # one process, from a run at comm.size ranks
    again = make_strategy("zero2", resumed, comm)  # and sharded again, from the loaded state
    for g in grads[3:]:
        again.step(g)
        plain.step(g)
    for k in shapes:
        np.testing.assert_allclose(again.params[k], plain.params[k], rtol=1e-12, atol=1e-14)


def _train_zero3(comm: Communicator, rule: str, model: str, groups: int, planned: bool = False,
                 whole: bool = False) -> tuple[list[float], dict[str, np.ndarray], object, int]:
    """20 steps of ``model`` under ZeRO-3 (the groups on reference or planned executors): the
    losses, the final parameters, the strategy and the most groups ever gathered at once. On
    the planned executor each group's plan is compiled at the first step and never again."""
    from meta.lv1 import PlannedExecutor, ReferenceExecutor
    from meta.lv3.data_parallel.zero3 import Zero2Grouped, Zero3

    graph = _model(model)
    kind = PlannedExecutor if planned else ReferenceExecutor
    strategy = (Zero2Grouped if whole else Zero3)(Optimizer(RULES[rule](), graph.parameters), comm, graph,
                     lambda g: kind(g), groups=groups)
    executor = strategy.executor.train()
    most, prefetched = [0], [0]
    gather = executor.gather

    def counted(g: int) -> np.ndarray:
        prefetched[0] += g in executor.pending  # its allgather started a group earlier
        buf = gather(g)
        most[0] = max(most[0], len(executor.live))
        return buf

    executor.gather = counted
    losses = []
    for feeds in _batches(comm, model):
        values = strategy.step_with(executor, feeds)
        loss = np.array([float(values["loss"])])
        comm.allreduce(loss)
        losses.append(float(loss[0]) / comm.size)
    executor.gather = gather  # finish gathers the whole model, on purpose
    if not whole:  # forward, backward (whole: gathered once, after each update)
        assert prefetched[0] >= 2 * STEPS * (groups - 1) - STEPS, prefetched
    # the slots stay where the executors bind them (planned), else are freed between steps
    assert executor.persistent == planned and executor.pointed == planned
    if planned:  # one plan per group, bound to its slot: compiled once, never stale
        for ex in executor.executors:
            assert ex.unplanned is None, ex.unplanned
            plans = [p for p in ex._plans.values() if not isinstance(p, str)]
            assert len(plans) == 1 and not plans[0].stale(ex.graph), len(plans)
        for s, ex in enumerate(executor.executors):
            if executor.hooked[s]:  # the plan writes into the gradient slot, owns no copy
                plan = next(iter(ex._plans.values()))
                own = executor.grad_views[s]
                assert all(plan.gradients[n] is own[n] for n in own if n in plan.gradients)
    strategy.timeline.end_steps()
    strategy.finish()
    return losses, {k: np.array(v) for k, v in graph.parameters.items()}, strategy, most[0]


def _model(model: str):
    from meta.lv1 import gpt, mlp

    if model == "gpt":  # its output head tied to the token embedding: read by two groups
        return gpt((8,), classes=11, layers=2, heads=2, width=16, seed=1)
    return mlp((1, 4, 4), hidden=(13, 7), classes=3, seed=1)


def check_zero3_equals_allreduce(comm: Communicator) -> None:
    """20 steps under ZeRO-3 (layer groups gathered one or two at a time, the saved contexts'
    weights stashed and re-gathered for the backward) equal allreduce's within 1e-6 (float32)
    with SGD-momentum and Adam, on an MLP and on a GPT whose head is tied to its embedding;
    every rank the same parameters; the state gathered at ``finish`` equals allreduce's (the
    GPT's attention key biases under Adam aside: ``_noise``). Both on the reference executor
    and on the planned one (each group a compiled plan; allreduce's whole graph one)."""
    from meta.lv1.plan import runtime

    for planned in ((False, True) if runtime.available() else (False,)):
        for model, groups in (("mlp", 3), ("gpt", 4)):
            for rule in RULES:
                _zero3_against_allreduce(comm, model, groups, rule, planned)


def check_zero2_grouped_equals_allreduce(comm: Communicator) -> None:
    """ZeRO-2 through ZeRO-3's layer groups with the parameters kept whole (what a recipe's
    zero2 runs on the planned executor): 20 steps equal allreduce's as ZeRO-3's do, on the
    GPT with its tied head, SGD-momentum and Adam, planned; every group live all along."""
    from meta.lv1.plan import runtime

    if runtime.available():
        for rule in RULES:
            _zero3_against_allreduce(comm, "gpt", 4, rule, True, whole=True)


def _zero3_against_allreduce(comm: Communicator, model: str, groups: int, rule: str,
                             planned: bool, whole: bool = False) -> None:
    from meta.lv1 import PlannedExecutor, ReferenceExecutor

    graph = _model(model)
    ref = make_strategy("allreduce", Optimizer(RULES[rule](), graph.parameters), comm,
                        shared_memory=False)
    executor = (PlannedExecutor if planned else ReferenceExecutor)(graph).train()
    ref_losses = []
    for feeds in _batches(comm, model):
        loss = np.array([float(ref.step_with(executor, feeds)["loss"])])
        comm.allreduce(loss)
        ref_losses.append(float(loss[0]) / comm.size)
    ref.finish()
    what = f"{model} {rule} planned={planned} whole={whole}"
    losses, params, zero, most = _train_zero3(comm, rule, model, groups, planned, whole)
    # never the whole model (tied: a group and the head); whole: every group
    assert most == groups if whole else most <= 2, (what, most)
    phases = {e[0] for e in zero.timeline.events}
    assert {"communicate", "forward", "backward", "update"} <= phases, phases
    assert len(zero.groups) == groups
    np.testing.assert_allclose(losses, ref_losses, rtol=0, atol=1e-6, err_msg=what)
    for k, v in graph.parameters.items():
        if _noise(k, rule):
            continue
        np.testing.assert_allclose(params[k], v, rtol=0, atol=_tolerance(k, rule),
                                   err_msg=f"{what} {k}")
        gathered = comm.allgather(np.ascontiguousarray(params[k]))
        assert all(np.array_equal(g, gathered[0]) for g in gathered), k
    if comm.is_root:
        ours, theirs = (_arrays(zero.state_dict()["state"], rule),
                        _arrays(ref.state_dict()["state"], rule))
        assert len(ours) == len(theirs) > 0, what
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6, err_msg=what)


def check_zero3_recompute_equals_without(comm: Communicator) -> None:
    """ZeRO-3 with ``recompute`` (each group's forward run again before its backward; planned
    groups sharing one arena) gives bit-identical losses and parameters to ZeRO-3 without it
    (the same plans on the same inputs), on the GPT under Adam, reference and planned."""
    from meta.lv1 import PlannedExecutor, ReferenceExecutor
    from meta.lv1.plan import runtime
    from meta.lv3.data_parallel.zero3 import Zero3

    for kind in ((ReferenceExecutor, PlannedExecutor) if runtime.available()
                 else (ReferenceExecutor,)):
        runs = []
        for recompute in (None, "blocks"):
            graph = _model("gpt")
            zero = Zero3(Optimizer(RULES["adam"](), graph.parameters), comm, graph,
                         lambda g: kind(g), groups=3, recompute=recompute)
            executor = zero.executor.train()
            losses = [float(zero.step_with(executor, feeds)["loss"])
                      for feeds in _batches(comm, "gpt")[:5]]
            if recompute and kind is PlannedExecutor:  # one arena, one plan per group
                assert len({id(ex.arena) for ex in executor.executors}) == 1
                assert all(len(ex._plans) == 1 for ex in executor.executors)
            zero.finish()
            runs.append((losses, {k: np.array(v) for k, v in graph.parameters.items()}))
        (losses, params), (again, recomputed) = runs
        assert losses == again, (kind.__name__, losses, again)
        for k, v in params.items():
            np.testing.assert_array_equal(recomputed[k], v, err_msg=f"{kind.__name__} {k}")


def check_zero3_checkpoint_resumes_at_another_rank_count(comm: Communicator) -> None:
    """What ZeRO-3 saves (the whole model and the whole state per parameter name, rank 0)
    resumes both in one process (a plain optimizer) and in a new ZeRO-3 run (restored the
    runner's way: the parameters into its graph, then the state): three more steps of each
    equal the original run's own (every rank the same batches, so the mean is each one's)."""
    from meta.lv1 import ReferenceExecutor
    from meta.lv3.data_parallel.zero3 import Zero3

    rng = np.random.default_rng(7)  # the same on every rank
    batches = [{"input": rng.standard_normal((6, 1, 4, 4)).astype(np.float32),
                "labels": rng.integers(0, 3, 6)} for _ in range(6)]
    graph = _model("mlp")
    zero = Zero3(Optimizer(adam(0.01), graph.parameters), comm, graph,
                 lambda g: ReferenceExecutor(g), groups=3)
    zero.executor.train()
    for feeds in batches[:3]:
        zero.step_with(zero.executor, feeds)
    zero.finish()
    saved = comm.bcast_obj((zero.state_dict(), {k: np.array(v) for k, v in
                                                graph.parameters.items()})
                           if comm.is_root else None)
    state, params = saved
    for feeds in batches[3:]:
        zero.step_with(zero.executor, feeds)
    zero.finish()

    alone = _model("mlp")  # one process
    for k, v in params.items():
        alone.parameters[k][...] = v
    plain = Optimizer(adam(0.01), alone.parameters)
    plain.load_state_dict(state)
    executor = ReferenceExecutor(alone).train()
    for feeds in batches[3:]:
        plain.step(executor.inference_and_backprop(feeds)[1])

    again_graph = _model("mlp")  # a new sharded run, restored as the runner restores
    again = Zero3(Optimizer(adam(0.01), again_graph.parameters), comm, again_graph,
                  lambda g: ReferenceExecutor(g), groups=2)
    for k, v in params.items():
        again.executor.graph.initializers[k][...] = v
    again.load_state_dict(state)
    again.executor.train()
    for feeds in batches[3:]:
        again.step_with(again.executor, feeds)
    again.finish()
    for k in params:
        np.testing.assert_allclose(alone.parameters[k], graph.parameters[k], rtol=0,
                                   atol=1e-6, err_msg=k)
        np.testing.assert_allclose(again_graph.parameters[k], graph.parameters[k], rtol=0,
                                   atol=1e-6, err_msg=k)


def _noise(name: str, rule: str) -> bool:
    """An attention key's bias has an analytically zero gradient (softmax ignores a shift of
    its row): what it gets is float noise (3e-12) whose sign depends on the order of the sums,
    which differs between allreduce and reduce-scatter at 4 ranks, and Adam moves it by about
    lr * noise / eps (1e-6) a step either way: its trajectory is that noise's, not ZeRO's."""
    return name.endswith("attn.k.bias") and rule in ("adam", "clipped")


def _tolerance(name: str, rule: str) -> float:
    """1e-6, but 2e-6 for an attention key's weight under Adam: for the same reason as its
    bias (``_noise``), one direction of its gradient is analytically zero (the inputs'
    LayerNorm shift: the gradients of a row's keys sum to zero), so Adam moves that component
    by the float noise of the sums' order, which differs more between one plan of the whole
    graph (allreduce) and one plan per layer group (measured 1.1e-6 once at 4 ranks, planned,
    clipped Adam; 5.7e-7 on the reference executor)."""
    return 2e-6 if name.endswith("attn.k.weight") and rule in ("adam", "clipped") else 1e-6


def _arrays(tree: object, rule: str = "") -> list[np.ndarray]:
    """The arrays of an optimizer state, in a fixed order (dicts by key; noise left out)."""
    if isinstance(tree, dict):
        return [a for k in sorted(tree) if not _noise(str(k), rule)
                for a in _arrays(tree[k], rule)]
    if isinstance(tree, (tuple, list)):
        return [a for v in tree for a in _arrays(v, rule)]
    return [tree] if isinstance(tree, np.ndarray) else []


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_reduce_scatter_and_allgatherv,
        check_zero2_equals_allreduce,
        check_zero2_state_resumes_at_another_rank_count,
        check_zero3_equals_allreduce,
        check_zero2_grouped_equals_allreduce,
        check_zero3_recompute_equals_without,
        check_zero3_checkpoint_resumes_at_another_rank_count,
    )
}

if __name__ == "__main__":
    sys.exit(checks.main(CHECKS, sys.argv[1:]))
