"""DequantizeLinear (ONNX opsets 10+; per-axis 13, blocked 21, output_dtype 23):
``y = (x - x_zero_point) * x_scale`` in x_scale's type (or ``output_dtype``).

Backward: x and its zero point are integers (no gradient); x_scale gets
``sum((x - x_zero_point) * dy)`` over the elements each scale serves.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from meta.lv0 import Operator, register

from ._quantize import broadcast_param


@register("DequantizeLinear", since=10)
class DequantizeLinear(Operator):
    """ONNX DequantizeLinear-10: the linear dequantization operator."""
    attributes = {"axis": 1, "block_size": 0, "output_dtype": 0}
    no_grad_inputs = (0, 2)

    def forward(self, ctx, x, x_scale, x_zero_point=None):
        shifted = x.astype(np.float32 if x_scale.dtype != np.float64 else np.float64)
        if x_zero_point is not None:
            if x_zero_point.dtype != x.dtype:
                raise ValueError(f"DequantizeLinear: x {x.dtype} and x_zero_point "
                                 f"{x_zero_point.dtype} must have one type")
            shifted = shifted - broadcast_param(x_zero_point, x.shape, self.axis,
                                                self.block_size, "x_zero_point")
        scale = broadcast_param(x_scale, x.shape, self.axis, self.block_size, "x_scale")
        dtype = helper.tensor_dtype_to_np_dtype(self.output_dtype) if self.output_dtype \
            else x_scale.dtype
        ctx.save(shifted=shifted, scale_shape=np.shape(x_scale), x_shape=x.shape)
        return (shifted * scale).astype(dtype)

    def backward(self, ctx, dy):
        if dy is None or not ctx.needs(1):
            return (None, None, None)
        g = dy * ctx.shifted
        shape = ctx.scale_shape
        if int(np.prod(shape)) == 1:
            return (None, g.sum().reshape(shape).astype(dy.dtype), None)
        axis = self.axis % len(ctx.x_shape)
        if not self.block_size:
            other = tuple(i for i in range(g.ndim) if i != axis)
            return (None, g.sum(axis=other).astype(dy.dtype), None)
        # blocks along axis: sum each block of block_size entries
        n = ctx.x_shape[axis]
        starts = np.arange(0, n, self.block_size)
        return (None, np.add.reduceat(g, starts, axis=axis).astype(dy.dtype), None)
