"""Samplers: which examples form each minibatch, reproducibly from a seed."""

from __future__ import annotations

from typing import Iterator

import numpy as np


class ShuffleSampler:
    """Minibatches of a fresh random permutation each epoch, seeded by (seed, epoch).

    The permutation of epoch e depends only on ``seed`` and ``e``, so a run resumed at epoch e
    sees the same batches as an uninterrupted one.

    >>> s = ShuffleSampler(10, batch_size=4, seed=0)
    >>> [len(b) for b in s]
    [4, 4, 2]
    """

    def __init__(self, num_examples: int, batch_size: int, seed: int = 0,
                 drop_last: bool = False) -> None:
        if num_examples <= 0:
            raise ValueError(f"ShuffleSampler: num_examples must be positive, got {num_examples}")
        if batch_size <= 0:
            raise ValueError(f"ShuffleSampler: batch_size must be positive, got {batch_size}")
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds this epoch's order (so a resumed run draws the same
        batches)."""
        self.epoch = epoch

    def batch_rng(self, batch_index: int) -> np.random.Generator:
        """The generator for augmenting batch ``batch_index`` of this epoch (and nothing else)."""
        return np.random.default_rng([self.seed, self.epoch, batch_index, 0xA06])

    def indices(self) -> np.ndarray:
        """This epoch's order of example indices."""
        rng = np.random.default_rng([self.seed, self.epoch])
        return rng.permutation(self.num_examples)

    def __iter__(self) -> Iterator[np.ndarray]:
        order = self.indices()
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        for start in range(0, stop, self.batch_size):
            yield order[start : start + self.batch_size]

    def epoch_size(self) -> int:
        """How many indices one epoch yields (subclasses that shard or pad override it)."""
        return self.num_examples

    def __len__(self) -> int:
        n = self.epoch_size()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class SequentialSampler(ShuffleSampler):
    """Minibatches in dataset order (for evaluation)."""

    def indices(self) -> np.ndarray:
        return np.arange(self.num_examples)
