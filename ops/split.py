"""Split: cut a tensor along ``axis`` into pieces.

The sizes come from the ``split`` attribute (opsets 2-12) or the optional int64 ``split`` input
(13+); without them the input is split evenly into as many pieces as the node has outputs - from
opset 18 that number is the ``num_outputs`` attribute, and then the last piece may be smaller.
Before 18 the operator cannot see the node's outputs: graph loading (``make_operator``) sets
``n_outputs``.
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register

from ._axes import as_ints, normalize_axis


@register("Split", since=18)
class Split(Operator):
    """ONNX Split-18: Split a tensor into a list of tensors, along the specified 'axis'."""
    attributes = {"axis": 0, "num_outputs": None}
    n_outputs: int | None = None  # the node's output count, for even splits before opset 18

    def sizes(self, length: int, split: list[int] | None) -> list[int]:
        if split is not None:
            if sum(split) != length or any(s < 0 for s in split):
                raise ValueError(f"Split: sizes {split} do not add up to the axis length {length}")
            return split
        count = getattr(self, "num_outputs", None)
        if count is not None:
            # Opset 18: ceil(length / n) per piece, the last one takes what is left.
            step = math.ceil(length / count)
            return [min(step, max(length - i * step, 0)) for i in range(count)]
        if not self.n_outputs:
            raise ValueError("Split: without 'split' sizes the number of outputs must be known; "
                             "graph loading sets n_outputs from the node")
        if length % self.n_outputs:
            raise ValueError(f"Split: axis length {length} does not split evenly into "
                             f"{self.n_outputs} outputs")
        return [length // self.n_outputs] * self.n_outputs

    def forward(self, ctx, x, split=None):
        split = as_ints(split) or None  # an empty split is no split
        if split is not None and getattr(self, "num_outputs", None) is not None:
            raise ValueError("Split: give either the split input or num_outputs, not both")
        axis = normalize_axis(self.axis, x.ndim, self.op_type)
        sizes = self.sizes(x.shape[axis], split)
        ctx.save(axis=axis, sizes=sizes, dtype=x.dtype, shape=x.shape)
        return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))

    def backward(self, ctx, *dys):
        if not np.issubdtype(ctx.dtype, np.floating):
            return (None, None)
        pieces = []
        for dy, size in zip(dys, ctx.sizes):
            if dy is None:  # an output nobody used
                shape = list(ctx.shape)
                shape[ctx.axis] = size
                dy = np.zeros(shape, ctx.dtype)
            pieces.append(dy)
        return (np.concatenate(pieces, axis=ctx.axis), None)


@register("Split", since=13)
class Split13(Split):
    """ONNX Split-13: Split a tensor into a list of tensors, along the specified 'axis'."""
    attributes = {"axis": 0}


@register("Split", since=2)
class Split2(Split):
    """ONNX Split-2: Split a tensor into a list of tensors, along the specified 'axis'."""
    attributes = {"axis": 0, "split": None}

    def forward(self, ctx, x):
        return super().forward(ctx, x, self.split)
