from __future__ import annotations

import numpy as np
import pytest

from meta.lv2 import SequentialSampler, ShuffleSampler


def epoch(sampler, e):
    sampler.set_epoch(e)
    return np.concatenate(list(sampler))


def test_every_index_once_per_epoch_in_a_seeded_order():
    s = ShuffleSampler(103, batch_size=10, seed=7)
    first = epoch(s, 0)
    assert sorted(first) == list(range(103))
    assert len(s) == 11 and [len(b) for b in s][-1] == 3
    np.testing.assert_array_equal(first, epoch(ShuffleSampler(103, 10, seed=7), 0))
    assert not np.array_equal(first, epoch(s, 1))
    assert not np.array_equal(first, epoch(ShuffleSampler(103, 10, seed=8), 0))


def test_resuming_at_an_epoch_gives_the_same_batches():
    a, b = ShuffleSampler(50, 8, seed=1), ShuffleSampler(50, 8, seed=1)
    epoch(a, 0)
    np.testing.assert_array_equal(epoch(a, 3), epoch(b, 3))


def test_drop_last():
    s = ShuffleSampler(103, 10, seed=0, drop_last=True)
    assert len(s) == 10 and all(len(b) == 10 for b in s)


def test_sequential():
    assert np.array_equal(np.concatenate(list(SequentialSampler(5, 2))), np.arange(5))


@pytest.mark.parametrize("n,bs", [(0, 1), (5, 0)])
def test_bad_arguments(n, bs):
    with pytest.raises(ValueError, match="must be positive"):
        ShuffleSampler(n, bs)
