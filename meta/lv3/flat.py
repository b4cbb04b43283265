"""One contiguous buffer for many named arrays (Horovod's tensor fusion, DDP's buckets).

A step then costs one collective on one large message instead of one per tensor: per-message
latency, not bandwidth, dominates for the many small tensors of a network.

>>> flat = FlatBuffer.like({"w": np.ones((2, 2)), "b": np.zeros(2)})
>>> flat.buffer.tolist()
[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
>>> flat.pack({"w": np.ones((2, 2)), "b": np.zeros(2)}).tolist()
[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np


class FlatBuffer:
    """A persistent 1-D buffer and, for each name, a view of it with that name's shape.

    Names are laid out in the order given; the same ``shapes`` give the same layout on every rank.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype | type,
                 buffer: np.ndarray | None = None) -> None:
        """``buffer``: memory to lay the arrays out in (a 1-D array of ``dtype`` and their
        total size, e.g. a window of memory that ranks share); a new zeroed one if None."""
        self.dtype = np.dtype(dtype)
        """The float dtype of every array in it."""
        if not np.issubdtype(self.dtype, np.floating):
            raise TypeError(f"FlatBuffer: dtype must be a float type, got {self.dtype}")
        self.shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
        """Each name's shape, in layout order (the same on every rank given the same shapes)."""
        sizes = [math.prod(shape) for shape in self.shapes.values()]
        if buffer is None:
            buffer = np.zeros(sum(sizes), dtype=self.dtype)
        elif buffer.dtype != self.dtype or buffer.shape != (sum(sizes),):
            raise ValueError(f"FlatBuffer: the given buffer is {buffer.dtype}{list(buffer.shape)}"
                             f", the arrays need {self.dtype}[{sum(sizes)}]")
        self.buffer = buffer
        """The 1-D array holding every value, the names' in layout order: what one message sends."""
        self.views: dict[str, np.ndarray] = {}
        """Each name's view of ``buffer`` with its shape: writing one writes the buffer."""
        offset = 0
        for (name, shape), size in zip(self.shapes.items(), sizes):
            self.views[name] = self.buffer[offset : offset + size].reshape(shape)
            offset += size

    @classmethod
    def like(cls, arrays: Mapping[str, np.ndarray],
             buffer: np.ndarray | None = None) -> FlatBuffer:
        """A buffer laid out for ``arrays`` (which must share one float dtype), in ``buffer``
        if given; not filled."""
        dtypes = {name: np.asarray(a).dtype for name, a in arrays.items()}
        distinct = set(dtypes.values())
        if len(distinct) > 1:
            listed = ", ".join(f"{name}: {dt}" for name, dt in dtypes.items())
            raise TypeError(f"FlatBuffer.like: arrays must share one float dtype, got {listed}")
        dtype = distinct.pop() if distinct else np.dtype(np.float64)
        return cls({name: np.shape(a) for name, a in arrays.items()}, dtype, buffer)

    @classmethod
    def adopt(cls, arrays: dict[str, np.ndarray], into: np.ndarray | None = None) -> FlatBuffer:
        """Move ``arrays`` into a new buffer (or ``into``): their values are copied in and each
        entry of the dict is replaced by its view, so in-place updates through the dict land in
        the buffer.

        Whoever else holds the old arrays must be rebound to the views (``holder.update(arrays)``).

        >>> params = {"w": np.ones(2)}
        >>> flat = FlatBuffer.adopt(params)
        >>> params["w"] += 1; flat.buffer.tolist()
        [2.0, 2.0]
        """
        flat = cls.like(arrays, into)
        flat.pack(arrays)
        arrays.update(flat.views)
        return flat

    def chunks(self, chunk_bytes: int) -> list[np.ndarray]:
        """The buffer cut into consecutive views of at most ``chunk_bytes`` (at least one item)."""
        if chunk_bytes <= 0:
            raise ValueError(f"FlatBuffer.chunks: chunk_bytes must be positive, got {chunk_bytes}")
        step = max(1, chunk_bytes // self.dtype.itemsize)
        return [self.buffer[i : i + step] for i in range(0, max(len(self), 1), step)]

    @property
    def nbytes(self) -> int:
        """The bytes of the fused buffer."""
        return self.buffer.nbytes

    def _check(self, arrays: Mapping[str, np.ndarray], what: str) -> None:
        missing = [name for name in self.views if name not in arrays]
        extra = [name for name in arrays if name not in self.views]
        if missing or extra:
            raise KeyError(f"FlatBuffer.{what}: missing {missing}, unexpected {extra}")
        for name, view in self.views.items():
            if np.shape(arrays[name]) != view.shape:
                raise ValueError(
                    f"FlatBuffer.{what}: {name!r} has shape {np.shape(arrays[name])}, "
                    f"the buffer holds {view.shape}"
                )

    def pack(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        """Copy ``arrays`` into the buffer; returns the buffer."""
        self._check(arrays, "pack")
        for name, view in self.views.items():
            np.copyto(view, arrays[name], casting="same_kind")
        return self.buffer

    def unpack_into(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy the buffer back into ``arrays``' own memory (callers keep their references)."""
        self._check(arrays, "unpack_into")
        for name, view in self.views.items():
            np.copyto(arrays[name], view, casting="same_kind")

    def __len__(self) -> int:
        return self.buffer.size

    def __repr__(self) -> str:
        return f"FlatBuffer({len(self.views)} arrays, {self.buffer.size} x {self.dtype})"


def shard_bounds(n: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's contiguous slice of an ``n``-value buffer (sizes differ by 1).

    >>> shard_bounds(5, 2)
    [(0, 3), (3, 5)]
    """
    edges = [j * (n // servers) + min(j, n % servers) for j in range(servers + 1)]
    return list(zip(edges[:-1], edges[1:]))
