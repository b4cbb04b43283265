"""DynamicQuantizeLinear (ONNX opset 11+): uint8 quantization of a float tensor with the
scale and zero point taken from its own range (widened to include 0):
``scale = (max - min) / 255``, ``zero_point = saturate(round(-min / scale))``,
``y = saturate(round(x / scale) + zero_point)``, in float32 as onnx.reference. No gradient
(the outputs are integers, or functions of the extremes only)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Operator):
    """ONNX DynamicQuantizeLinear-11: A Function to fuse calculation for Scale, Zero Point and
    FP32->8Bit conversion of FP32 Input data."""
    no_grad_inputs = (0,)

    def forward(self, ctx, x):
        high = np.float32(max(0.0, float(np.max(x)))) if x.size else np.float32(0)
        low = np.float32(min(0.0, float(np.min(x)))) if x.size else np.float32(0)
        scale = np.float32(1.0 if high == low else high - low) / np.float32(255)
        zero = np.rint(np.clip(np.float32(0) - low / scale, 0, 255))
        y = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8)
        return y, np.array(scale, x.dtype), np.array(zero, np.uint8)

    def backward(self, ctx, *grads):
        return (None,)
