from __future__ import annotations

import numpy as np

from meta.lv2 import ShuffleSampler
from meta.lv2.transforms import Compose, Cutout, HorizontalFlip, Normalize, RandomCrop


def images(n=6, c=2, h=5, w=7):
    return np.arange(n * c * h * w, dtype=np.float32).reshape(n, c, h, w) + 1


def test_random_crop_matches_a_manual_crop():
    x = images()
    out = RandomCrop(padding=2)(x, np.random.default_rng(0))
    rng = np.random.default_rng(0)
    dy, dx = rng.integers(0, 5, 6), rng.integers(0, 5, 6)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    for i in range(6):
        np.testing.assert_array_equal(out[i], padded[i, :, dy[i]:dy[i] + 5, dx[i]:dx[i] + 7])


def test_flip_and_cutout():
    x = images()
    flipped = HorizontalFlip(p=1.0)(x, np.random.default_rng(0))
    np.testing.assert_array_equal(flipped, x[..., ::-1])
    assert np.array_equal(HorizontalFlip(p=0.0)(x, np.random.default_rng(0)), x)
    cut = Cutout(size=3)(images(h=9, w=9), np.random.default_rng(1))
    zeroed = (cut == 0).all(axis=1).sum(axis=(1, 2))  # per image, zeroed pixels in all channels
    assert ((zeroed >= 1) & (zeroed <= 9)).all() and (zeroed == 9).any()


def test_normalize_and_compose_are_reproducible():
    t = Compose(RandomCrop(1), HorizontalFlip(), Normalize([1.0, 2.0], [2.0, 4.0]))
    a = t(images(), np.random.default_rng(5))
    b = t(images(), np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32


def test_sampler_generators_are_keyed_by_seed_epoch_and_batch():
    s = ShuffleSampler(10, 2, seed=1)
    first = s.batch_rng(3).random()
    assert s.batch_rng(3).random() == first and s.batch_rng(4).random() != first
    s.set_epoch(1)
    assert s.batch_rng(3).random() != first
