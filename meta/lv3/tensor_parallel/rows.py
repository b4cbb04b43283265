"""Which rows of a batch each rank holds under sequence parallelism (``sequence``): the
operators (``ops``) and their plan steps (``lowering``) split alike."""

from __future__ import annotations

import numpy as np


def rows(batch: int, ranks: int, rank: int) -> slice:
    """Rank ``rank``'s rows of a batch of ``batch`` (``np.array_split`` order: the first
    ``batch % ranks`` ranks one more)."""
    base, extra = divmod(batch, ranks)
    begin = rank * base + min(rank, extra)
    return slice(begin, begin + base + (rank < extra))


def row_counts(whole: np.ndarray, ranks: int) -> list[int]:
    """Elements of each rank's rows of ``whole`` (axis 0), in rank order."""
    per_row = int(np.prod(whole.shape[1:], dtype=np.int64))
    return [(r.stop - r.start) * per_row for r in
            (rows(len(whole), ranks, q) for q in range(ranks))]
