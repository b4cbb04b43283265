"""TensorScatter (ONNX opset 24+): write ``update`` into a copy of ``past_cache`` along
``axis``, at ``write_indices[b]`` (default 0) for batch b onwards, wrapping around with
``mode="circular"``.

Backward: the cache's gradient is dY with the written spots zeroed, the update's is dY read
at those spots; write_indices has none.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("TensorScatter", since=24)
class TensorScatter(Operator):
    """ONNX TensorScatter-24: TensorScatter is a generic tensor update operation, motivated by
    the requirements for KV cache updates for Attention ops commonly found in LLMs."""
    attributes = {"axis": -2, "mode": "linear"}
    no_grad_inputs = (2,)

    def positions(self, cache_shape, update_shape, write_indices):
        """(index tuple into the cache for the update's elements) per batch."""
        if self.mode not in ("linear", "circular"):
            raise ValueError(f"TensorScatter: unknown mode {self.mode!r}")
        axis = self.axis % len(cache_shape)
        if axis == 0:
            raise ValueError("TensorScatter: axis 0 is the batch axis")
        for i, (c, u) in enumerate(zip(cache_shape, update_shape)):
            if (i != axis and c != u) or (i == axis and u > c):
                raise ValueError(f"TensorScatter: update {list(update_shape)} does not fit "
                                 f"past_cache {list(cache_shape)} along axis {axis}")
        starts = np.zeros(cache_shape[0], np.int64) if write_indices is None else \
            np.reshape(write_indices, -1).astype(np.int64)
        length, capacity = update_shape[axis], cache_shape[axis]
        index = starts[:, None] + np.arange(length)[None, :]  # (B, L)
        if self.mode == "circular":
            index %= capacity
        elif index.size and (index.max() >= capacity or index.min() < 0):
            raise ValueError(f"TensorScatter: writes past the cache's {capacity} slots "
                             f"(write_indices {starts.tolist()}, {length} entries)")
        shape = [1] * len(cache_shape)
        shape[0], shape[axis] = cache_shape[0], length
        batch = np.arange(cache_shape[0]).reshape([-1] + [1] * (len(cache_shape) - 1))
        return axis, batch, index.reshape(shape)

    def select(self, array, axis, batch, index, update_shape):
        """array[b, ..., index[b, l], ...] as an array of update_shape."""
        moved = np.moveaxis(array, axis, 1)  # (B, S, ...)
        idx = np.moveaxis(index, axis, 1).reshape(index.shape[0], -1)  # (B, L)
        picked = moved[np.arange(array.shape[0])[:, None], idx]  # (B, L, ...)
        return np.moveaxis(picked, 1, axis).reshape(update_shape), moved, idx

    def forward(self, ctx, past_cache, update, write_indices=None):
        axis, batch, index = self.positions(past_cache.shape, update.shape, write_indices)
        out = past_cache.copy()
        moved = np.moveaxis(out, axis, 1)
        idx = np.moveaxis(index, axis, 1).reshape(index.shape[0], -1)
        moved[np.arange(out.shape[0])[:, None], idx] = np.moveaxis(update, axis, 1)
        ctx.save(axis=axis, idx=idx, update_shape=update.shape)
        return out

    def backward(self, ctx, dy):
        axis, idx = ctx.axis, ctx.idx
        rows = np.arange(dy.shape[0])[:, None]
        moved = np.moveaxis(dy, axis, 1)
        dupdate = np.moveaxis(moved[rows, idx], 1, axis).reshape(ctx.update_shape)
        dcache = dy.copy()
        np.moveaxis(dcache, axis, 1)[rows, idx] = 0
        return (dcache, dupdate, None)
