"""MaxUnpool (ONNX opsets 9+; 11 only widened types): the inverse of MaxPool with indices.

X (N, C, *in) and I (MaxPool's flat indices into the output, same shape as X) give Y, zero
except ``Y.flat[I] = X``. Y's shape is ``output_shape`` when given (the unpooled data at its
top-left corner), else ``(in - 1) * stride - pad_begin - pad_end + kernel`` per axis.
Backward: ``dX = dY.flat[I]`` (read at the same spots); I and output_shape have none.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("MaxUnpool", since=9)
class MaxUnpool(Operator):
    """ONNX MaxUnpool-9: MaxUnpool essentially computes the partial inverse of the MaxPool op."""
    attributes = {"kernel_shape": None, "pads": None, "strides": None}
    no_grad_inputs = (1, 2)

    def forward(self, ctx, x, indices, output_shape=None):
        if self.kernel_shape is None:
            raise ValueError("MaxUnpool: the kernel_shape attribute is required")
        rank = len(self.kernel_shape)
        strides = self.strides or [1] * rank
        pads = self.pads or [0] * (2 * rank)
        inferred = [x.shape[0], x.shape[1], *(
            (x.shape[2 + d] - 1) * strides[d] - pads[d] - pads[rank + d] + self.kernel_shape[d]
            for d in range(rank))]
        if indices.shape != x.shape:
            raise ValueError(f"MaxUnpool: I {list(indices.shape)} must have X's shape "
                             f"{list(x.shape)}")
        flat = np.zeros(int(np.prod(inferred)), x.dtype)
        flat[indices.reshape(-1)] = x.reshape(-1)
        y = flat.reshape(inferred)
        if output_shape is not None:
            shape = [int(v) for v in np.reshape(output_shape, -1)]
            if any(s < i for s, i in zip(shape, inferred)):
                raise ValueError(f"MaxUnpool: output_shape {shape} is smaller than the "
                                 f"unpooled shape {inferred}")
            out = np.zeros(shape, x.dtype)
            out[tuple(slice(0, n) for n in inferred)] = y
            y = out
        ctx.save(indices=indices, inferred=inferred)
        return y

    def backward(self, ctx, dy):
        core = dy[tuple(slice(0, n) for n in ctx.inferred)].reshape(-1)
        return (core[ctx.indices.reshape(-1)].reshape(ctx.indices.shape), None, None)
