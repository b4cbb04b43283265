"""A sampler that gives each rank a disjoint shard of the same shuffled epoch."""

from __future__ import annotations

import numpy as np

from meta.lv2.sampler import ShuffleSampler


class DistributedSampler(ShuffleSampler):
    """Rank ``rank`` of ``size`` takes every size-th index of the epoch's shared permutation.

    Every rank draws the same permutation from (seed, epoch), pads it by wrapping around to a
    multiple of ``size`` and takes ``perm[rank::size]``, so all ranks get the same number of
    batches: they must, since each batch ends in an allreduce that every rank has to join.
    ``batch_size`` is per rank (the global batch is ``size * batch_size``, as in Horovod and DDP).
    With ``drop_last`` the tail is cut to a multiple of ``size`` instead of padded (no example
    is seen twice in an epoch) and incomplete batches are dropped.

    >>> [b.tolist() for b in DistributedSampler(5, batch_size=2, rank=1, size=2, seed=0)]
    [[4, 0], [2]]
    """

    def __init__(self, num_examples: int, batch_size: int, rank: int, size: int, seed: int = 0,
                 drop_last: bool = False) -> None:
        super().__init__(num_examples, batch_size, seed=seed, drop_last=drop_last)
        if size <= 0:
            raise ValueError(f"DistributedSampler: size must be positive, got {size}")
        if not 0 <= rank < size:
            raise ValueError(f"DistributedSampler: rank {rank} is not in [0, {size})")
        if drop_last and num_examples < size:
            raise ValueError(
                f"DistributedSampler: drop_last with {num_examples} examples over {size} ranks "
                "leaves every rank empty"
            )
        self.rank = rank
        """This replica's index: which shard of the data it takes."""
        self.size = size
        """Replicas sharing the data."""

    def epoch_size(self) -> int:
        if self.drop_last:
            return self.num_examples // self.size
        return -(-self.num_examples // self.size)

    def indices(self) -> np.ndarray:
        """This rank's shard of the epoch's permutation (the same length on every rank)."""
        order = super().indices()
        total = self.epoch_size() * self.size
        order = np.resize(order, total)  # np.resize repeats from the start: padding by wrapping
        return order[self.rank :: self.size]
