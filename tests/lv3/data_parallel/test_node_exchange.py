"""The pieces of the allreduce strategy's shared-memory exchange that need no MPI (the exchange
itself is checked under mpiexec: ``check_shared_memory_exchange_matches_mpi_allreduce`` in
``mpi_checks.py``)."""

from __future__ import annotations

import pytest

from meta.lv2.optimizers import adam, chain, clip_by_global_norm, masked, register_optimizer, sgd
from meta.lv3.comm.costmodel import Link, ring_allreduce, shared_reduce
from meta.lv3.data_parallel.node_exchange import slice_of


@pytest.mark.parametrize("n, itemsize, ranks", [(100, 4, 2), (669706, 4, 2), (669706, 4, 3),
                                                (5, 8, 4), (17, 4, 5), (1, 4, 2)])
def test_slices_cover_the_buffer_once_cut_at_cache_lines(n, itemsize, ranks) -> None:
    slices = [slice_of(n, itemsize, ranks, r) for r in range(ranks)]
    assert slices[0][0] == 0 and slices[-1][1] == n
    for (_, hi), (lo, _) in zip(slices, slices[1:]):
        assert hi == lo and (lo * itemsize) % 64 == 0 or lo == n
    sizes = [hi - lo for lo, hi in slices]  # near-equal: a line apart, and the last line short
    assert max(sizes) - min(sizes) <= 2 * 64 // itemsize


def test_which_optimizers_can_be_stepped_a_slice_at_a_time() -> None:
    """Only an update that reads each value alone may be cut (ZeRO's slices)."""
    assert sgd(0.1).elementwise and sgd(0.1, momentum=0.9).elementwise
    assert sgd(0.1, momentum=0.9, weight_decay=1e-4).elementwise
    assert adam(1e-3).elementwise and chain(sgd(0.1), adam(1e-3)).elementwise
    assert not chain(clip_by_global_norm(1.0), sgd(0.1)).elementwise  # a global norm
    assert not masked(sgd(0.1), lambda name: True).elementwise  # chooses by name

    @register_optimizer("test_unknown_rule")
    def unknown(lr):
        return sgd(lr)._replace(elementwise=False)  # a user's rule: unknown unless declared

    assert not unknown(0.1).elementwise


def test_shared_reduce_model_moves_reduce_scatters_volume() -> None:
    link = Link(alpha=2e-6, beta=1e-10)
    assert shared_reduce(link, 1, 1e6) == 0.0
    assert shared_reduce(link, 2, 1e6) == pytest.approx(2 * 2e-6 + 0.5e6 * 1e-10)
    assert shared_reduce(link, 4, 1e6) < ring_allreduce(link, 4, 1e6) / 2 + 2e-6 * 2
