from __future__ import annotations

import numpy as np
import pytest

from meta.lv2.sampler import ShuffleSampler
from meta.lv3 import DistributedSampler


def shards(n: int, batch: int, size: int, **kw) -> list[DistributedSampler]:
    return [DistributedSampler(n, batch, rank=r, size=size, **kw) for r in range(size)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 23, 24])
@pytest.mark.parametrize("batch", [1, 3])
def test_shards_cover_with_wrapped_padding(n: int, batch: int, size: int) -> None:
    samplers = shards(n, batch, size, seed=3)
    order = ShuffleSampler(n, batch, seed=3).indices()
    per_rank = -(-n // size)
    got = [np.concatenate(list(s)) for s in samplers]
    assert all(len(g) == per_rank for g in got)
    np.testing.assert_array_equal(np.stack(got, axis=1).ravel(), np.resize(order, per_rank * size))
    assert set(np.concatenate(got).tolist()) == set(range(n))
    counts = {(len(s), sum(1 for _ in s)) for s in samplers}
    assert counts == {(-(-per_rank // batch),) * 2}  # same number of batches on every rank


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_drop_last_is_disjoint_and_full(size: int) -> None:
    samplers = shards(23, 2, size, seed=1, drop_last=True)
    batches = [list(s) for s in samplers]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(samplers[0])
    assert all(len(b) == 2 for rank in batches for b in rank)
    seen = np.concatenate([b for rank in batches for b in rank])
    assert len(set(seen.tolist())) == len(seen)


def test_size_one_is_the_shuffle_sampler() -> None:
    dist, plain = DistributedSampler(10, 4, rank=0, size=1, seed=9), ShuffleSampler(10, 4, seed=9)
    for epoch in range(3):
        dist.set_epoch(epoch)
        plain.set_epoch(epoch)
        assert [b.tolist() for b in dist] == [b.tolist() for b in plain]


def test_global_batch_matches_single_process() -> None:
    size, batch = 4, 3
    samplers = shards(48, batch, size, seed=2)
    reference = ShuffleSampler(48, size * batch, seed=2)
    for epoch in (0, 1):
        for s in [*samplers, reference]:
            s.set_epoch(epoch)
        for ref, *per_rank in zip(reference, *samplers):
            assert sorted(np.concatenate(per_rank).tolist()) == sorted(ref.tolist())


def test_epochs_differ_but_ranks_agree() -> None:
    a, b = shards(20, 5, 2, seed=0)
    first = a.indices()
    a.set_epoch(1)
    b.set_epoch(1)
    assert not np.array_equal(first, a.indices())
    assert set(a.indices().tolist()).isdisjoint(b.indices().tolist())


def test_errors() -> None:
    with pytest.raises(ValueError, match="rank 2 is not in"):
        DistributedSampler(10, 2, rank=2, size=2)
    with pytest.raises(ValueError, match="size must be positive"):
        DistributedSampler(10, 2, rank=0, size=0)
    with pytest.raises(ValueError, match="leaves every rank empty"):
        DistributedSampler(3, 1, rank=0, size=4, drop_last=True)
    with pytest.raises(ValueError, match="batch_size"):
        DistributedSampler(10, 0, rank=0, size=2)
