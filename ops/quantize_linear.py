"""QuantizeLinear (ONNX opsets 10+; per-axis 13, blocked and output_dtype 21, precision 23):
``y = saturate(round(x / y_scale) + y_zero_point)``, rounding half to even.

The output type is y_zero_point's, else ``output_dtype``, else uint8: 8- and 16-bit integers
(float8, int4 and int2 have no numpy dtype). The result is an integer tensor: no gradient.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from meta.lv0 import Operator, register

from ._quantize import broadcast_param, quantized_type, saturate


@register("QuantizeLinear", since=10)
class QuantizeLinear(Operator):
    """ONNX QuantizeLinear-10: the linear per-tensor/layer quantization operator."""
    attributes = {"axis": 1, "saturate": 1, "block_size": 0, "output_dtype": 0}
    no_grad_inputs = (0, 1, 2)
    precision = 0

    def forward(self, ctx, x, y_scale, y_zero_point=None):
        if y_zero_point is not None:
            dtype = y_zero_point.dtype
            if self.output_dtype and helper.np_dtype_to_tensor_dtype(dtype) != self.output_dtype:
                raise ValueError(f"QuantizeLinear: output_dtype {self.output_dtype} is not "
                                 f"y_zero_point's type {dtype}")
        elif self.output_dtype:
            dtype = helper.tensor_dtype_to_np_dtype(self.output_dtype)
        else:
            dtype = np.uint8
        dtype = quantized_type(dtype, "QuantizeLinear")
        scale = broadcast_param(y_scale, x.shape, self.axis, self.block_size, "y_scale")
        if self.precision:
            work = helper.tensor_dtype_to_np_dtype(self.precision)
            scaled = x.astype(work) / scale.astype(work)
        else:
            scaled = x / scale
        q = np.rint(scaled)
        if y_zero_point is not None:
            q = q + broadcast_param(y_zero_point, x.shape, self.axis, self.block_size,
                                    "y_zero_point").astype(np.float64)
        return saturate(q, dtype)

    def backward(self, ctx, dy):
        return (None, None, None)


@register("QuantizeLinear", since=23)
class QuantizeLinear23(QuantizeLinear):
    """Opset 23 adds ``precision``: the type the division is computed in."""

    attributes = {**QuantizeLinear.attributes, "precision": 0}
