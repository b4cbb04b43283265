"""Axis arguments shared by the shape and reduction operators: attributes or int64 inputs."""

from __future__ import annotations

from typing import Iterable

import numpy as np


def as_ints(value: np.ndarray | Iterable[int] | int | None) -> list[int] | None:
    """An axes/shape/pads value, given as attribute (list) or input (int64 tensor), as ints."""
    if value is None:
        return None
    return [int(v) for v in np.asarray(value).reshape(-1)]


def normalize_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative index; an error naming ``op`` otherwise."""
    if not -rank <= axis < rank:
        raise ValueError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def normalize_axes(axes: Iterable[int], rank: int, op: str) -> tuple[int, ...]:
    """Sorted non-negative axes; ONNX forbids repeating an axis, so that is an error too."""
    result = [normalize_axis(int(a), rank, op) for a in axes]
    if len(set(result)) != len(result):
        raise ValueError(f"{op}: repeated axis in {list(axes)} (rank {rank})")
    return tuple(sorted(result))
