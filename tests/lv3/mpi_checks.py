"""MPI checks written once (mpi4py's test style): each takes a Communicator and asserts.

pytest runs them in-process at size 1; under MPI they run as a script, on every rank:

    mpiexec -n 4 python tests/lv3/mpi_checks.py [check_name ...]

A failing rank prints its traceback and aborts the whole job, so no other rank waits forever.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv2.sampler import ShuffleSampler
from meta.lv3 import (
    Allreduce,
    AllreduceOptimizer,
    AsyncParameterServer,
    Communicator,
    DistributedSampler,
    FlatBuffer,
    ModelAveraging,
    MPICommunicator,
    ParameterServer,
    RingAveraging,
    Sign,
    Strategy,
    Timeline,
    TopK,
    allreduce_mean,
    chrome_trace,
    make_strategy,
    measure_link,
)
from tests import checks


def check_allreduce(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    buf = np.arange(6, dtype=np.float64).reshape(2, 3) + r
    assert comm.allreduce(buf) is buf
    np.testing.assert_array_equal(buf, p * np.arange(6).reshape(2, 3) + p * (p - 1) / 2)
    for op, expected in (("max", p - 1), ("min", 0)):
        buf = np.full(3, r, dtype=np.float32)
        comm.allreduce(buf, op=op)
        np.testing.assert_array_equal(buf, np.full(3, expected, dtype=np.float32))
    ints = np.array([r, 1], dtype=np.int64)
    np.testing.assert_array_equal(comm.allreduce(ints), [p * (p - 1) // 2, p])
    np.testing.assert_array_equal(allreduce_mean(comm, float(r)), (p - 1) / 2)


def check_bcast(comm: Communicator) -> None:
    root = comm.size - 1
    buf = np.full((2, 2), comm.rank, dtype=np.float64)
    assert comm.bcast(buf, root=root) is buf
    np.testing.assert_array_equal(buf, np.full((2, 2), root))
    assert comm.bcast_obj({"epoch": comm.rank}, root=0) == {"epoch": 0}


def check_allgather(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    out = comm.allgather(np.array([r, 10 * r], dtype=np.float32))
    assert out.shape == (p, 2) and out.dtype == np.float32
    np.testing.assert_array_equal(out, [[q, 10 * q] for q in range(p)])
    gathered = comm.gather_obj(r, root=0)
    assert gathered == (list(range(p)) if comm.is_root else None)
    assert comm.allreduce_obj(r + 1) == p * (p + 1) // 2
    assert comm.allreduce_obj(r, op="max") == p - 1
    comm.barrier()


def check_noncontiguous_rejected(comm: Communicator) -> None:
    # Every rank fails before entering MPI, so nobody is left waiting in the collective.
    strided = np.zeros((4, 4))[:, ::2]
    for call in (comm.allreduce, comm.bcast, comm.allgather):
        try:
            call(strided)
        except ValueError as err:
            assert "(4, 2)" in str(err) and "float64" in str(err), err
        else:
            raise AssertionError(f"{call.__name__} accepted a non-contiguous array")


def check_thread_level(comm: Communicator) -> None:
    if isinstance(comm, MPICommunicator):  # asked for before MPI_Init: MPICH's fast allreduce
        import os

        expected = "THREAD_SINGLE" if "OMPI_COMM_WORLD_SIZE" in os.environ else "THREAD_MULTIPLE"
        assert comm._MPI.Query_thread() == getattr(comm._MPI, expected), comm._MPI.Query_thread()


def check_distributed_sampler(comm: Communicator) -> None:
    n, batch, p = 23, 3, comm.size
    sampler = DistributedSampler(n, batch, rank=comm.rank, size=p, seed=5)
    sampler.set_epoch(2)
    shard = np.concatenate(list(sampler))
    np.testing.assert_array_equal(shard, sampler.indices())
    shards = comm.allgather(shard)  # same length on every rank, or Allgather would fail
    padded = -(-n // p) * p
    assert shards.size == padded
    assert set(shards.ravel().tolist()) == set(range(n))
    counts = comm.allgather(np.array([len(sampler), sum(1 for _ in sampler)]))
    assert (counts == counts[0]).all() and counts[0, 0] == counts[0, 1], counts


def _problem() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    x = rng.normal(size=(96, 5))
    y = x @ rng.normal(size=(5, 2)) + 0.5 + 0.01 * rng.normal(size=(96, 2))
    return x, y


def _init(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"w": 0.1 * rng.normal(size=(5, 2)), "b": rng.normal(size=2)}


def _grads(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradient of the mean of 0.5 * |x w + b - y|^2 over the batch."""
    residual = x @ params["w"] + params["b"] - y
    return {"w": x.T @ residual / len(x), "b": residual.mean(axis=0)}


def _loss(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float(0.5 * np.mean(np.sum((x @ params["w"] + params["b"] - y) ** 2, axis=1)))


def check_broadcast_on_construction(comm: Communicator) -> None:
    params = _init(seed=100 + comm.rank)
    arrays = dict(params)
    opt = AllreduceOptimizer(Optimizer(sgd(0.1), params), comm)
    assert opt.params is params and list(params) == list(arrays)  # the same dict, rebound
    for name, view in params.items():
        assert view is opt.flat_params.views[name]
        assert np.shares_memory(view, opt.flat_params.buffer)
    expected = _init(seed=100)
    for name in expected:
        np.testing.assert_array_equal(params[name], expected[name])


def _assert_replicas_identical(comm: Communicator, params: dict[str, np.ndarray]) -> None:
    everyone = comm.allgather(FlatBuffer.like(params).pack(params))
    assert all(np.array_equal(row, everyone[0]) for row in everyone), "ranks diverged"


def check_allreduce_sgd_matches_single_process(comm: Communicator) -> None:
    x, y = _problem()
    per_rank, epochs, p = 4, 2, comm.size
    opt = Allreduce(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm, chunk_bytes=24)
    assert len(opt.grad_chunks) == 4  # 12 float64 values in chunks of 3: four Iallreduces
    sampler = DistributedSampler(len(x), per_rank, rank=comm.rank, size=p, seed=7)
    reference = Optimizer(sgd(0.1), _init(seed=100))  # one process at batch p * per_rank
    ref_sampler = ShuffleSampler(len(x), p * per_rank, seed=7)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ref_sampler.set_epoch(epoch)
        assert len(sampler) == len(ref_sampler)
        for idx, ref_idx in zip(sampler, ref_sampler):
            opt.step(_grads(opt.params, x[idx], y[idx]))
            reference.step(_grads(reference.params, x[ref_idx], y[ref_idx]))
            _assert_replicas_identical(comm, opt.params)
    assert _loss(opt.params, x, y) < 0.1 * _loss(_init(seed=100), x, y)
    for name, value in reference.params.items():
        np.testing.assert_allclose(opt.params[name], value, rtol=1e-6, atol=1e-12)
    assert opt.bytes_sent == (0 if p == 1 else 2 * len(sampler) * 12 * 8)


def _endless(sampler: DistributedSampler) -> Iterator[np.ndarray]:
    for epoch in itertools.count():
        sampler.set_epoch(epoch)
        yield from sampler


def _train_side_by_side(comm: Communicator, first: Strategy, second: Strategy,
                        steps: int = 12, check_every_step: bool = True) -> None:
    """Step both strategies on the same per-rank gradients (of their own parameters)."""
    x, y = _problem()
    sampler = DistributedSampler(len(x), 4, rank=comm.rank, size=comm.size, seed=3)
    for _, idx in zip(range(steps), _endless(sampler)):
        for strategy in (first, second):
            strategy.step(_grads(strategy.params, x[idx], y[idx]))
            if check_every_step and strategy.consistent:
                _assert_replicas_identical(comm, strategy.params)


def check_parameter_server_matches_allreduce(comm: Communicator) -> None:
    allreduce = Allreduce(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm)
    server = ParameterServer(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm)
    _train_side_by_side(comm, allreduce, server)
    for name, value in allreduce.params.items():
        if comm.size <= 2:  # a + b == b + a: the root's sum is MPI's sum, bit for bit
            np.testing.assert_array_equal(server.params[name], value)
        else:  # MPI may add in another order than the root's (g0 + g1) + g2 + ...
            np.testing.assert_allclose(server.params[name], value, rtol=1e-13, atol=1e-15)


def check_model_averaging_h1_matches_gradient_averaging(comm: Communicator) -> None:
    allreduce = Allreduce(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm)
    averaging = ModelAveraging(Optimizer(sgd(0.1), _init(seed=100 + comm.rank)), comm,
                               average_every=1)
    _train_side_by_side(comm, allreduce, averaging)
    for name, value in allreduce.params.items():  # mean(p - lr g_i) = p - lr mean(g_i)
        np.testing.assert_allclose(averaging.params[name], value, rtol=1e-12, atol=1e-14)


def check_model_averaging_every_h_ends_consistent(comm: Communicator) -> None:
    opt = make_strategy("model_averaging", Optimizer(sgd(0.1, momentum=0.9), _init(seed=1)),
                        comm, average_every=3)
    _train_side_by_side(comm, opt, Allreduce(Optimizer(sgd(0.1), _init(seed=2)), comm), steps=7)
    assert opt.bytes_sent == (0 if comm.size == 1 else 2 * 12 * 8)  # after steps 3 and 6
    opt.finish()  # step 7 is averaged here
    assert opt.bytes_sent == (0 if comm.size == 1 else 3 * 12 * 8)
    _assert_replicas_identical(comm, opt.params)


def check_ring_averages_with_neighbours(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    ring = RingAveraging(Optimizer(sgd(0.5), _init(seed=1)), comm)
    assert ring.neighbours == sorted({(r - 1) % p, (r + 1) % p} - {r})
    flat = FlatBuffer.like(ring.params)
    for step in range(3):
        grads = _init(seed=10 * step + r)  # different on every rank
        before = comm.allgather(flat.pack(ring.params))
        all_grads = comm.allgather(flat.pack(grads))
        ring.step(grads)
        stepped = before - 0.5 * all_grads
        expected = stepped[[r, *ring.neighbours]].mean(axis=0)
        np.testing.assert_allclose(flat.pack(ring.params), expected, rtol=1e-13)
    ring.finish()
    _assert_replicas_identical(comm, ring.params)


def check_compressed_allreduce_keeps_replicas_identical(comm: Communicator) -> None:
    for compression in ("fp16", "topk", "sign"):
        opt = make_strategy("allreduce", Optimizer(sgd(0.05), _init(seed=100 + comm.rank)),
                            comm, compression=compression, topk_ratio=0.25)
        x, y = _problem()
        start = _loss(opt.params, x, y)
        _train_side_by_side(comm, opt, Allreduce(Optimizer(sgd(0.1), _init(1)), comm), steps=40)
        assert _loss(opt.params, x, y) < 0.5 * start, (compression, _loss(opt.params, x, y))
        assert opt.bytes_sent == 40 * opt.compressor.payload_bytes


def check_error_feedback_invariant(comm: Communicator) -> None:
    rng = np.random.default_rng(comm.rank)
    for compressor in (TopK(50, np.float64, ratio=0.1), Sign(50, np.float64)):
        raw_sum, sent_sum = np.zeros(50), np.zeros(50)
        for _ in range(20):
            grad = rng.normal(size=50)
            raw_sum += grad
            sent_sum += compressor.decompress(compressor.compress(grad))
        np.testing.assert_allclose(sent_sum + compressor.residual, raw_sum, rtol=0, atol=1e-12)
        assert np.abs(compressor.residual).sum() > 0  # something was held back


def check_async_parameter_server(comm: Communicator) -> None:
    x, y = _problem()
    ps = AsyncParameterServer(Optimizer(sgd(0.05), _init(seed=100 + comm.rank)), comm)
    assert ps.role == ("server" if comm.size > 1 and comm.rank == comm.size - 1 else "worker")
    start = _loss(ps.params, x, y)
    if ps.role == "server":
        ps.serve()
    else:
        rank, size = AsyncParameterServer.replica(comm.rank, comm.size)
        assert ps.group.size == size and ps.group.rank == rank
        sampler = DistributedSampler(len(x), 4, rank=rank, size=size, seed=3)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for idx in sampler:
                ps.step(_grads(ps.params, x[idx], y[idx]))
        ps.finish()
    assert _loss(ps.params, x, y) < 0.1 * start, (start, _loss(ps.params, x, y))
    _assert_replicas_identical(comm, ps.params)  # everyone got the server's final parameters


def check_point_to_point(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    if p == 1:
        return
    right, left = (r + 1) % p, (r - 1) % p
    inbox, outbox = np.zeros(3), np.full(3, float(r))
    requests = [comm.irecv(inbox, left), comm.isend(outbox, right, tag=5)]
    index, tag = comm.waitany(requests)
    comm.waitall(requests)
    assert index in (0, 1) and (index == 1 or tag == 5), (index, tag)
    np.testing.assert_array_equal(inbox, np.full(3, float(left)))
    gathered = comm.gather(outbox, root=p - 1)
    assert (gathered is None) == (r != p - 1)
    if gathered is not None:
        np.testing.assert_array_equal(gathered[:, 0], np.arange(p))


def check_timeline_and_cost_model(comm: Communicator) -> None:
    opt = ParameterServer(Optimizer(sgd(0.1), _init(seed=1)), comm, timeline=Timeline())
    _train_side_by_side(comm, opt, Allreduce(Optimizer(sgd(0.1), _init(1)), comm), steps=5)
    report = opt.report()
    assert opt.timeline.steps == 5 and 0.99 < sum(v for k, v in report.items()
                                                 if k.endswith("_share")) < 1.01, report
    folder = comm.bcast_obj(tempfile.mkdtemp() if comm.is_root else None)
    path = chrome_trace(opt.timeline, comm, Path(folder) / "trace.json")
    if comm.is_root:
        events = json.loads(path.read_text())["traceEvents"]
        complete = [e for e in events if e["ph"] == "X"]
        assert {e["pid"] for e in complete} == set(range(comm.size))
        assert {"compute", "pack", "communicate", "update"} <= {e["name"] for e in complete}
    link = measure_link(comm)
    links = comm.gather_obj(link)
    assert links is None or all(other == link for other in links)
    assert link.alpha >= 0 and link.beta >= 0 and opt.predict_comm_s(link) >= 0


def check_state_is_averaged_apart_from_the_gradients(comm: Communicator) -> None:
    """Running statistics that differ per replica become their mean on every replica, counted
    in ``state_bytes_sent``, never in the per-step ``bytes_sent``."""
    params = {"w": np.ones(3)}
    strategy = Allreduce(Optimizer(sgd(0.1), params), comm)
    state = {"bn.running_mean": np.full(4, float(comm.rank), np.float32),
             "bn.running_var": np.full((2, 2), 1.0 + comm.rank, np.float32)}
    strategy.sync_state(state)
    mean = (comm.size - 1) / 2
    np.testing.assert_allclose(state["bn.running_mean"], mean)
    np.testing.assert_allclose(state["bn.running_var"], 1.0 + mean)
    assert strategy.bytes_sent == 0
    assert strategy.state_bytes_sent == (32 if comm.size > 1 else 0)


def check_overlapped_allreduce_matches_the_one_after_the_backward(comm: Communicator) -> None:
    """With the planned executor, buckets of gradients start their allreduce during the
    backward (small buckets: several per step); the parameters end as with the exchange
    after the backward, every rank the same, and the timeline holds the overlapped calls."""
    from meta.lv1 import PlannedExecutor, lenet5
    from meta.lv1.plan import runtime

    if not runtime.available():
        return
    rng = np.random.default_rng(comm.rank)
    batches = [{"input": rng.standard_normal((n, 1, 28, 28)).astype(np.float32),
                "labels": rng.integers(0, 10, n)} for n in (8, 5, 8)]  # two plans, in turn
    finals = []
    for overlap, shared in ((True, False), (False, False), (False, True)):
        graph = lenet5(seed=1)
        strategy = Allreduce(Optimizer(sgd(0.05, momentum=0.9), graph.parameters), comm,
                             overlap=overlap, bucket_bytes=16 * 1024, shared_memory=shared)
        executor = PlannedExecutor(graph).train()
        for feeds in batches:
            strategy.step_with(executor, feeds)
        if shared and comm.size > 1:  # the backward wrote into the shared window
            assert strategy.node is not None and strategy.node.sharded is not None
            assert "allreduce (overlapped)" not in {e[0] for e in
                                                    strategy.timeline.background_events}
        strategy.finish()
        finals.append({k: v.copy() for k, v in graph.parameters.items()})
        if overlap and comm.size > 1:
            assert strategy.buckets.used
            calls = [e for e in strategy.timeline.background_events
                     if e[0] == "allreduce (overlapped)"]
            assert len(calls) >= 3 * 3, len(calls)  # several buckets per step
    for k in finals[0]:
        for other in finals[1:]:
            np.testing.assert_allclose(finals[0][k], other[k], rtol=1e-5, atol=1e-6, err_msg=k)
        gathered = comm.allgather(np.ascontiguousarray(finals[0][k]))
        assert all(np.array_equal(g, gathered[0]) for g in gathered), k


def check_shared_memory_exchange_matches_mpi_allreduce(comm: Communicator) -> None:
    """On one machine the allreduce strategy sums the gradients in shared memory and gives
    each rank a slice of the update (ZeRO-1: SGD with momentum in place, Adam functionally)
    or, for an optimizer that is not elementwise (global-norm clipping), the whole mean: the
    parameters and the optimizer state end as with MPI's allreduce, every rank the same; a
    sharded state saves per parameter and loads back; ``finish`` gives each rank its own
    memory again."""
    from meta.lv2.optimizers import adam, chain, clip_by_global_norm

    shapes = {"w": (7, 5), "b": (5,), "v": (3,)}
    rules = {"momentum": lambda: sgd(0.05, momentum=0.9),
             "adam": lambda: adam(0.01, weight_decay=1e-3),
             "clipped": lambda: chain(clip_by_global_norm(0.5), sgd(0.05, momentum=0.9))}
    for rule, make in rules.items():
        ends = []
        for shared in (False, True):
            params = {k: np.random.default_rng(3).standard_normal(s) for k, s in shapes.items()}
            strategy = Allreduce(Optimizer(make(), params), comm, shared_memory=shared)
            if shared and comm.size > 1:
                assert strategy.node is not None
                assert (strategy.node.sharded is not None) == (rule != "clipped"), rule
            rng = np.random.default_rng(10 + comm.rank)
            for _ in range(4):
                strategy.step({k: rng.standard_normal(s) for k, s in shapes.items()})
            saved = strategy.state_dict()
            ends.append(({k: v.copy() for k, v in params.items()},
                         [np.array(x, copy=True) for x in _arrays(saved["state"])]))
            strategy.load_state_dict(saved)  # a round trip changes nothing
            assert all(np.array_equal(a, b) for a, b in
                       zip(_arrays(strategy.state_dict()["state"]), ends[-1][1])), rule
            strategy.finish()
            if shared and comm.size > 1:  # private again: this rank's write stays here
                params["w"][0, 0] = comm.rank
                gathered = comm.allgather(np.ascontiguousarray(params["w"]))
                assert [g[0, 0] for g in gathered] == list(range(comm.size)), rule
                params["w"][0, 0] = ends[-1][0]["w"][0, 0]
        (mpi, mpi_state), (node, node_state) = ends
        resumed = Optimizer(make(), {k: v.copy() for k, v in node.items()})
        resumed.load_state_dict(saved)  # a checkpoint read before the strategy is built
        strategy = Allreduce(resumed, comm)
        assert all(np.array_equal(a, b) for a, b in
                   zip(_arrays(strategy.state_dict()["state"]), node_state)), rule
        strategy.finish()
        for k in mpi:
            np.testing.assert_allclose(node[k], mpi[k], rtol=1e-12, atol=1e-14,
                                       err_msg=f"{rule} {k}")
            gathered = comm.allgather(np.ascontiguousarray(node[k]))
            assert all(np.array_equal(g, gathered[0]) for g in gathered), (rule, k)
        assert len(mpi_state) == len(node_state), rule
        for a, b in zip(mpi_state, node_state):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14, err_msg=rule)


def _arrays(tree: object) -> list[np.ndarray]:
    """The arrays of an optimizer state, in a fixed order (dicts by key)."""
    if isinstance(tree, dict):
        return [a for k in sorted(tree) for a in _arrays(tree[k])]
    if isinstance(tree, (tuple, list)):
        return [a for v in tree for a in _arrays(v)]
    return [tree] if isinstance(tree, np.ndarray) else []


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__: f
    for f in (
        check_allreduce,
        check_bcast,
        check_allgather,
        check_noncontiguous_rejected,
        check_thread_level,
        check_distributed_sampler,
        check_broadcast_on_construction,
        check_allreduce_sgd_matches_single_process,
        check_parameter_server_matches_allreduce,
        check_model_averaging_h1_matches_gradient_averaging,
        check_model_averaging_every_h_ends_consistent,
        check_ring_averages_with_neighbours,
        check_compressed_allreduce_keeps_replicas_identical,
        check_error_feedback_invariant,
        check_async_parameter_server,
        check_point_to_point,
        check_timeline_and_cost_model,
        check_state_is_averaged_apart_from_the_gradients,
        check_overlapped_allreduce_matches_the_one_after_the_backward,
        check_shared_memory_exchange_matches_mpi_allreduce,
    )
}


def main(argv: list[str]) -> int:
    return checks.main(CHECKS, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
