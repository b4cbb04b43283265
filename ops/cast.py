"""Cast: convert to the element type ``to``, a TensorProto enum (ONNX opset 6+).

Float to float casts pass the gradient back, cast to the input's type; a cast from or to a
non-float type is piecewise constant, so the input gets no gradient. ``saturate`` (19+) only
affects float8 types, which numpy lacks.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

# TensorProto.DataType values numpy can represent.
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
          7: np.int64, 8: np.str_, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32,
          13: np.uint64, 14: np.complex64, 15: np.complex128}


def _is_float(dtype) -> bool:
    return np.issubdtype(dtype, np.floating)


@register("Cast", since=6)
class Cast(Operator):
    """ONNX Cast-6: the operator casts the elements of a given input tensor to a data type
    specified by the 'to' argument and returns an output tensor of the same size in the
    converted type."""
    attributes = {"to": None}

    @property
    def target(self) -> np.dtype:
        if self.to not in DTYPES:
            raise ValueError(f"Cast: unsupported target type to={self.to!r} (supported "
                             f"TensorProto types: {sorted(DTYPES)})")
        return np.dtype(DTYPES[self.to])

    @property
    def no_grad_inputs(self) -> tuple[int, ...]:
        return () if _is_float(self.target) else (0,)

    def forward(self, ctx, x):
        target = self.target
        ctx.save(dtype=x.dtype)
        return x.astype(target)

    def backward(self, ctx, dy):
        if dy is None or not (_is_float(ctx.dtype) and _is_float(dy.dtype)):
            return (None,)
        return (dy.astype(ctx.dtype, copy=False),)


@register("Cast", since=19)
class Cast19(Cast):
    """ONNX Cast-19: the operator casts the elements of a given input tensor to a data type
    specified by the 'to' argument and returns an output tensor of the same size in the
    converted type."""
    attributes = {"to": None, "saturate": 1}
