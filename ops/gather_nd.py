"""GatherND: slices of data addressed by the last axis of ``indices``, after ``batch_dims``
shared leading axes (ONNX opset 11+; 12 added batch_dims); the gradient scatter-adds dy."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._index import wrap


def nd_index(data_shape, indices: np.ndarray, batch_dims: int, op: str):
    """The index tuple ``data[...]`` reads, and the result's shape."""
    b = batch_dims
    k = indices.shape[-1]
    if b + k > len(data_shape) or tuple(indices.shape[:b]) != tuple(data_shape[:b]):
        raise ValueError(f"{op}: indices {list(indices.shape)} do not address data "
                         f"{list(data_shape)} with batch_dims={b}")
    outer = indices.shape[:-1]
    batch = [np.arange(n).reshape([-1 if i == j else 1 for j in range(len(outer))])
             for i, n in enumerate(data_shape[:b])]
    coords = [wrap(indices[..., j], data_shape[b + j], op) for j in range(k)]
    return tuple(batch + coords), tuple(outer) + tuple(data_shape[b + k:])


@register("GatherND", since=11)
class GatherND(Operator):
    """ONNX GatherND-11: given data tensor of rank r >= 1, and indices tensor of rank q >= 1,
    this operator gathers slices of data into an output tensor of rank q + r - indices_shape[-1]
    - 1."""
    attributes = {"batch_dims": 0}
    no_grad_inputs = (1,)

    def forward(self, ctx, data, indices):
        index, _ = nd_index(data.shape, indices, self.batch_dims, "GatherND")
        ctx.save(shape=data.shape, index=index)
        return np.asarray(data[index])

    def backward(self, ctx, dy):
        if dy is None:
            return (None, None)
        dx = np.zeros(ctx.shape, dy.dtype)
        np.add.at(dx, ctx.index, dy)
        return (dx, None)
