"""SplitToSequence (ONNX opset 11+): split a tensor along ``axis`` into a sequence: into
pieces of the sizes in ``split`` (1-D), of ``split`` each (a scalar; the last may be
shorter), or, without ``split``, into single slices (squeezed unless ``keepdims``)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis


@register("SplitToSequence", since=11)
class SplitToSequence(Operator):
    """ONNX SplitToSequence-11: split a tensor into a sequence of tensors, along the specified
    'axis'."""
    attributes = {"axis": 0, "keepdims": 1}
    no_grad_inputs = (1,)

    def forward(self, ctx, x, split=None):
        axis = normalize_axis(self.axis, x.ndim, "SplitToSequence")
        ctx.save(x_shape=x.shape, x_dtype=x.dtype, axis=axis)
        n = x.shape[axis]
        if split is None:
            pieces = np.split(x, n, axis=axis) if n else []
            ctx.save(pieces=[1] * n)
            return ([p if self.keepdims else np.squeeze(p, axis) for p in pieces],)
        sizes = np.reshape(split, -1).astype(np.int64)
        if np.ndim(split) == 0:
            step = int(sizes[0])
            sizes = [step] * (n // step) + ([n % step] if n % step else [])
        if sum(int(s) for s in sizes) != n:
            raise ValueError(f"SplitToSequence: split {list(map(int, sizes))} does not add up "
                             f"to {n} (axis {axis} of {list(x.shape)})")
        ctx.save(pieces=[int(s) for s in sizes])
        return (np.split(x, np.cumsum(sizes)[:-1].astype(int), axis=axis),)

    def backward(self, ctx, dseq):
        """The pieces' gradients put back in place (zeros where none reached a piece)."""
        dx = np.zeros(ctx.x_shape, ctx.x_dtype)
        start = 0
        for piece, g in zip(ctx.pieces, dseq or [None] * len(ctx.pieces)):
            index = [slice(None)] * len(ctx.x_shape)
            index[ctx.axis] = slice(start, start + piece)
            if g is not None:
                dx[tuple(index)] += g.reshape(dx[tuple(index)].shape)
            start += piece
        return dx, None
