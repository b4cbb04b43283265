"""Seeded data augmentation on (N, C, H, W) batches.

A transform is ``transform(x, rng) -> x``, and the generator always comes from the sampler
(``sampler.batch_rng(index)``), keyed by (seed, epoch, batch): a run is bit-reproducible, and a
run resumed mid-epoch draws exactly what the uninterrupted one drew.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Transform = Callable[[np.ndarray, np.random.Generator], np.ndarray]


class Compose:
    """Transforms applied one after the other, each with the same random generator.

        >>> import numpy as np
        >>> double = lambda x, rng: 2 * x
        >>> Compose(double, double)(np.ones(2), np.random.default_rng(0))
        array([4., 4.])
    """
    def __init__(self, *transforms: Transform) -> None:
        self.transforms = transforms

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        for t in self.transforms:
            x = t(x, rng)
        return x


class Normalize:
    """(x - mean) / std per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
        self.std = np.asarray(std, np.float32).reshape(1, -1, 1, 1)

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return ((x - self.mean) / self.std).astype(x.dtype, copy=False)


class RandomCrop:
    """Zero-pad by ``padding`` on each side, then crop each image back at a random offset."""

    def __init__(self, padding: int = 4) -> None:
        self.padding = padding

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n, _, h, w = x.shape
        p = self.padding
        padded = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
        dy, dx = rng.integers(0, 2 * p + 1, n), rng.integers(0, 2 * p + 1, n)
        rows = (dy[:, None] + np.arange(h))[:, None, :, None]
        cols = (dx[:, None] + np.arange(w))[:, None, None, :]
        return padded[np.arange(n)[:, None, None, None], np.arange(x.shape[1])[None, :, None, None],
                      rows, cols]


class HorizontalFlip:
    """Mirror each image left-right with probability ``p``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        flip = rng.random(len(x)) < self.p
        out = x.copy()
        out[flip] = x[flip, :, :, ::-1]
        return out


class Cutout:
    """Zero one ``size`` x ``size`` square per image at a random centre (DeVries & Taylor)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        n, _, h, w = x.shape
        cy, cx = rng.integers(0, h, n), rng.integers(0, w, n)
        ys, xs = np.arange(h)[None, :, None], np.arange(w)[None, None, :]
        half = self.size // 2
        inside = ((abs(ys - cy[:, None, None]) <= half - (self.size % 2 == 0))
                  & (abs(xs - cx[:, None, None]) <= half - (self.size % 2 == 0)))
        return np.where(inside[:, None], 0, x).astype(x.dtype, copy=False)
