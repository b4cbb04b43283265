"""Opset 1-6 broadcasting of the binary arithmetic operators: with ``broadcast=1``, B's shape
matches a contiguous run of A's dimensions starting at ``axis`` (default: A's trailing ones);
without it, A and B must have one shape. B is reshaped to numpy's alignment, so the opset 7
implementation (and its backward) does the rest."""

from __future__ import annotations

import numpy as np


def aligned_shape(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...], broadcast: int,
                  axis: int | None) -> tuple[int, ...]:
    """B's shape with trailing 1s, so numpy broadcasting lines it up at ``axis`` of A."""
    if not broadcast:
        if tuple(a_shape) != tuple(b_shape):
            raise ValueError(f"{op}: A {list(a_shape)} and B {list(b_shape)} must have one "
                             f"shape without broadcast=1 (opset < 7)")
        return tuple(b_shape)
    start = len(a_shape) - len(b_shape) if axis is None else axis % max(len(a_shape), 1)
    window = tuple(a_shape[start:start + len(b_shape)])
    if start < 0 or len(window) != len(b_shape) or any(
            n not in (1, m) for n, m in zip(b_shape, window)):
        raise ValueError(f"{op}: B {list(b_shape)} does not match A {list(a_shape)} at axis "
                         f"{start}")
    return tuple(b_shape) + (1,) * (len(a_shape) - start - len(b_shape))


class LegacyBroadcast:
    """Mixin for ``Add``-style operators of opset 6 and older (put it before the class)."""

    attributes = {"axis": None, "broadcast": 0}

    def forward(self, ctx, a, b):
        shape = aligned_shape(self.op_type, np.shape(a), np.shape(b), self.broadcast, self.axis)
        ctx.save(legacy_b_shape=np.shape(b))
        return super().forward(ctx, a, np.reshape(b, shape))

    def backward(self, ctx, dy):
        da, db = super().backward(ctx, dy)
        return da, None if db is None else np.reshape(db, ctx.legacy_b_shape)
