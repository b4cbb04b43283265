"""Index helpers shared by the gather/scatter operators."""

from __future__ import annotations

import numpy as np


def wrap(indices: np.ndarray, size: int, op: str) -> np.ndarray:
    """Indices in [-size, size) as non-negative int64; an error naming ``op`` otherwise."""
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise IndexError(f"{op}: indices must be in [{-size}, {size}), got "
                         f"[{indices.min()}, {indices.max()}]")
    return np.where(indices < 0, indices + size, indices)


def along_axis(x_shape, indices: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """The full index tuple that ``take_along_axis(x, indices, axis)`` reads."""
    grids = list(np.indices(indices.shape, sparse=True))
    grids[axis] = indices
    return tuple(grids)
