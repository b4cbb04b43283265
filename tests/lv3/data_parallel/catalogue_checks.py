"""MPI checks of the hierarchical parameter server, neighbourhood averaging and Hogwild.

Written once (mpi4py's test style): pytest runs them in-process at size 1; under MPI every rank
runs them as a script:

    mpiexec -n 5 python tests/lv3/data_parallel/catalogue_checks.py [check_name ...]

Each check needs only what its size offers (the hierarchy's bytes need two workers or more, the
ring comparison three ranks); below that it checks the size-1 behaviour.
"""

from __future__ import annotations

import sys
from typing import Callable

import numpy as np

from meta.lv2.optimizers import Optimizer, sgd
from meta.lv3 import (
    Communicator,
    HierarchicalParameterServer,
    Hogwild,
    NeighbourAveraging,
    RingAveraging,
)
from meta.lv3.comm.topology import exponential_offsets, topology
from tests.checks import main
from tests.lv3.mpi_checks import _assert_replicas_identical, _grads, _init, _loss, _problem

STEPS = 12


def _train_hierarchy(comm: Communicator, fan_in: int, lr: float = 0.1, steps: int = STEPS,
                     servers: int = 1) -> HierarchicalParameterServer:
    """Least squares, each worker on its own slice of the data; servers serve."""
    x, y = _problem()
    opt = HierarchicalParameterServer(Optimizer(sgd(lr), _init(seed=3)), comm, fan_in=fan_in,
                                      servers=servers)
    if opt.role == "server":
        opt.serve()
        return opt
    index, workers = opt.replica(comm.rank, comm.size, servers=servers)
    rows = np.arange(index, len(x), workers)
    for _ in range(steps):
        opt.step(_grads(opt.params, x[rows], y[rows]))
    opt.finish()
    return opt


def check_hierarchy_cuts_global_bytes_by_the_fan_in(comm: Communicator) -> None:
    one_level = _train_hierarchy(comm, fan_in=1).report()
    workers = max(comm.size - 1, 1)
    if comm.size == 1:
        assert "global_server_bytes_per_step" not in one_level
        return
    nbytes = 12 * 8  # w (5x2) and b (2), float64
    assert one_level["global_server_bytes_per_step"] == workers * nbytes, one_level
    for fan_in in sorted({2, workers}):
        tree = _train_hierarchy(comm, fan_in=fan_in).report()
        groups = -(-workers // fan_in)
        assert tree["aggregators"] == groups and tree["fan_in"] == min(fan_in, workers)
        assert tree["global_server_bytes_per_step"] == groups * nbytes, tree
        if workers % fan_in == 0:  # the drop is exactly the fan-in
            ratio = one_level["global_server_bytes_per_step"] / tree[
                "global_server_bytes_per_step"]
            assert ratio == fan_in, (ratio, fan_in)
        assert tree["pushes_applied"] == groups * STEPS, tree


def check_hierarchy_of_one_group_is_synchronous_sgd(comm: Communicator) -> None:
    """One aggregator over every worker: the server steps on the mean gradient, as one process
    with the whole batch does; every rank ends with those parameters."""
    x, y = _problem()
    workers = max(comm.size - 1, 1)
    opt = _train_hierarchy(comm, fan_in=workers)
    reference = Optimizer(sgd(0.1), _init(seed=3))
    for _ in range(STEPS):
        grads = [_grads(reference.params, x[i::workers], y[i::workers]) for i in range(workers)]
        reference.step({k: sum(g[k] for g in grads) / workers for k in reference.params})
    for name, value in reference.params.items():
        np.testing.assert_allclose(opt.params[name], value, rtol=1e-12, atol=1e-12)
    _assert_replicas_identical(comm, opt.params)
    assert opt.consistent


def check_hierarchy_of_two_groups_converges(comm: Communicator) -> None:
    x, y = _problem()
    start = _loss(_init(seed=3), x, y)
    opt = _train_hierarchy(comm, fan_in=2, lr=0.2, steps=60)
    assert _loss(opt.params, x, y) < 0.05 * start, (_loss(opt.params, x, y), start)
    _assert_replicas_identical(comm, opt.params)


def check_hierarchy_with_two_shards(comm: Communicator) -> None:
    """Two global shards (from 4 ranks): each aggregator's mean lands on both, in halves."""
    if comm.size < 4:
        return
    x, y = _problem()
    opt = _train_hierarchy(comm, fan_in=2, lr=0.2, steps=60, servers=2)
    groups = -(-(comm.size - 2) // 2)
    assert opt.report()["global_server_bytes_per_step"] == groups * 12 * 8
    assert _loss(opt.params, x, y) < 0.05 * _loss(_init(seed=3), x, y)
    _assert_replicas_identical(comm, opt.params)


def check_topologies_name_their_neighbours(comm: Communicator) -> None:
    r, p = comm.rank, comm.size
    graph = topology(comm, "graph")
    assert graph.sources == [(r - k) % p for k in exponential_offsets(p)]
    assert graph.destinations == [(r + k) % p for k in exponential_offsets(p)]
    ring = topology(comm, "cart", dims=1)
    assert ring.sources == ([] if p == 1 else [(r - 1) % p, (r + 1) % p])
    torus = topology(comm, "cart", dims=2)
    assert len(torus.sources) == (0 if p == 1 else 4)
    for hood in (graph, ring, torus):
        rows = hood.neighbor_allgather(np.array([float(r), 10.0 * r]))
        np.testing.assert_array_equal(rows, [[s, 10.0 * s] for s in hood.sources] or
                                      np.empty((0, 2)))
        # alltoall: block i goes to destinations[i] and says who sent it where
        blocks = np.array([[r, d] for d in hood.destinations], dtype=np.float64).reshape(-1, 2)
        got = hood.neighbor_alltoall(blocks)
        assert got.shape == (len(hood.sources), 2)
        assert all(row[1] == r for row in got)  # each block was addressed to this rank
        assert sorted(row[0] for row in got) == sorted(hood.sources)


def check_neighbour_averaging_reaches_the_mean(comm: Communicator) -> None:
    """No gradients, rank-valued replicas: gossip keeps the mean and shrinks the spread."""
    p = comm.size
    for kind, dims in (("cart", 1), ("cart", 2), ("graph", 1)):
        opt = NeighbourAveraging(Optimizer(sgd(0.1), {"w": np.zeros(6)}), comm, topology=kind,
                                 cart_dims=dims)
        opt.flat_params.buffer[:] = comm.rank
        for _ in range(40):
            opt.step({"w": np.zeros(6)})
        total = comm.allreduce(opt.flat_params.buffer.copy())
        np.testing.assert_allclose(total / p, (p - 1) / 2, atol=1e-12)  # doubly stochastic
        np.testing.assert_allclose(opt.params["w"], (p - 1) / 2, atol=1e-3)
        sent = opt.report()["bytes_sent_per_step"]  # before the final average
        assert sent == 6 * 8 * len(opt.neighbourhood.destinations), sent
        opt.finish()
        assert opt.replica_spread < 1e-3, (kind, dims, opt.replica_spread)


def check_neighbours_on_a_ring_match_ring_averaging(comm: Communicator) -> None:
    """From three ranks the ring's two neighbours are distinct: the same averaging."""
    if comm.size < 3:
        return
    x, y = _problem()
    rows = np.arange(comm.rank, len(x), comm.size)
    ours = NeighbourAveraging(Optimizer(sgd(0.1), _init(seed=3)), comm, topology="cart")
    ring = RingAveraging(Optimizer(sgd(0.1), _init(seed=3)), comm)
    for _ in range(STEPS):
        ours.step(_grads(ours.params, x[rows], y[rows]))
        ring.step(_grads(ring.params, x[rows], y[rows]))
    for name in ours.params:
        np.testing.assert_allclose(ours.params[name], ring.params[name], rtol=1e-12)
    assert ours.bytes_sent == ring.bytes_sent


def check_hogwild_ranks_share_one_copy(comm: Communicator) -> None:
    """Ranks taking turns see each other's updates exactly; racing, none is lost wholesale;
    afterwards every rank holds a private copy of the same values."""
    opt = Hogwild(Optimizer(sgd(1.0), {"w": np.zeros(1000), "b": np.zeros(3)}), comm)
    ones = {"w": np.ones(1000), "b": np.ones(3)}
    if comm.size > 1:
        assert np.shares_memory(opt.params["w"], opt.flat_params.buffer)
        assert opt.flat_params.buffer is opt.shared.flat.buffer
    for turn in range(comm.size):  # rank ``turn`` steps twice while the others wait
        if comm.rank == turn:
            opt.step(ones)
            opt.step(ones)
        comm.barrier()
    np.testing.assert_array_equal(opt.params["w"], np.full(1000, -2.0 * comm.size))
    comm.barrier()
    for _ in range(200):  # all at once, unlocked
        opt.step(ones)
    opt.finish()
    assert opt.shared is None and np.shares_memory(opt.params["w"], opt.private.buffer)
    done = -2.0 * comm.size - opt.params["w"]  # the racing steps that landed, per value
    assert np.all(done <= 200 * comm.size + 1e-9), done.max()  # none applied twice
    # Races lose an update only when two ranks read-modify-write one value at once: rare.
    assert done.mean() > 200 * (comm.size - 0.5), done.mean()
    _assert_replicas_identical(comm, opt.params)
    assert opt.report()["bytes_sent_per_step"] == 0.0


def check_hogwild_trains(comm: Communicator) -> None:
    x, y = _problem()
    rows = np.arange(comm.rank, len(x), comm.size)
    opt = Hogwild(Optimizer(sgd(0.1), _init(seed=3)), comm)
    start = _loss(_init(seed=3), x, y)  # the shared values may have moved on already
    for _ in range(80):
        opt.step(_grads(opt.params, x[rows], y[rows]))
    opt.finish()
    assert _loss(opt.params, x, y) < 0.05 * start
    _assert_replicas_identical(comm, opt.params)


CHECKS: dict[str, Callable[[Communicator], None]] = {
    f.__name__.removeprefix("check_"): f for f in (
        check_hierarchy_cuts_global_bytes_by_the_fan_in,
        check_hierarchy_of_one_group_is_synchronous_sgd,
        check_hierarchy_of_two_groups_converges,
        check_hierarchy_with_two_shards,
        check_topologies_name_their_neighbours,
        check_neighbour_averaging_reaches_the_mean,
        check_neighbours_on_a_ring_match_ring_averaging,
        check_hogwild_ranks_share_one_copy,
        check_hogwild_trains,
    )
}

if __name__ == "__main__":
    sys.exit(main(CHECKS, sys.argv[1:]))
