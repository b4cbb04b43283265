"""MatMul: numpy.matmul semantics (ONNX opset 1+): batched over leading dims, 1-D promoted.

A 1-D first operand is treated as a row (1, K) and a 1-D second operand as a column (K, 1);
the added dimension is removed from the result. Batch dimensions broadcast.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, native, register, unbroadcast


@register("MatMul", since=1)
class MatMul(Operator):
    """ONNX MatMul-1: matrix product that behaves like numpy.matmul."""
    learnable_inputs = (0, 1)  # either factor may be a weight
    def forward(self, ctx, a, b):
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError(f"MatMul: operands must have rank >= 1, got {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise ValueError(f"MatMul: inner dimensions differ: {a.shape} @ {b.shape}")
        try:
            y = np.matmul(a, b)
        except ValueError as err:
            raise ValueError(f"MatMul: cannot broadcast batch dimensions of {a.shape} and "
                             f"{b.shape}") from err
        ctx.save(a=a if ctx.needs(1) else None, b=b if ctx.needs(0) else None,
                 a_shape=a.shape, b_shape=b.shape)
        return y

    def backward(self, ctx, dy):
        a_shape, b_shape = ctx.a_shape, ctx.b_shape
        # Work on the promoted operands: (1, K) for a 1-D a, (K, 1) for a 1-D b.
        a2 = a_shape if len(a_shape) > 1 else (1, *a_shape)
        b2 = b_shape if len(b_shape) > 1 else (*b_shape, 1)
        dy2 = self._promote_dy(dy, len(a_shape), len(b_shape))
        da = db = None
        if ctx.needs(0):
            b = ctx.b.reshape(b2)
            da = unbroadcast(dy2 @ np.swapaxes(b, -1, -2), a2).reshape(a_shape)
        if ctx.needs(1):
            a = ctx.a.reshape(a2)
            db = unbroadcast(np.swapaxes(a, -1, -2) @ dy2, b2).reshape(b_shape)
        return (da, db)

    @staticmethod
    def _promote_dy(dy, a_rank, b_rank):
        """dy with the dimensions that 1-D promotion removed put back."""
        if a_rank == 1:
            dy = np.expand_dims(dy, -1 if b_rank == 1 else -2)
        if b_rank == 1:
            dy = np.expand_dims(dy, -1)
        return dy


@register("MatMul", since=1, backend="native")
class NativeMatMul(MatMul):
    """Matrix and equal-batch products through meta::blas::gemm with the GIL released; 1-D
    operands, broadcast batch dimensions and non-float dtypes take the numpy path."""

    def forward(self, ctx, a, b):
        if not (native.supports(a, b) and a.ndim == b.ndim >= 2 and a.shape[:-2] == b.shape[:-2]
                and a.shape[-1] == b.shape[-2]):
            return super().forward(ctx, a, b)
        y = self.product(a, b)
        ctx.save(a=a if ctx.needs(1) else None, b=b if ctx.needs(0) else None,
                 a_shape=a.shape, b_shape=b.shape)
        return y

    def backward(self, ctx, dy):
        a_shape, b_shape = ctx.a_shape, ctx.b_shape
        if not (len(a_shape) == len(b_shape) >= 2 and a_shape[:-2] == b_shape[:-2]
                and native.supports(dy)):  # float16: the forward took numpy's path too
            return super().backward(ctx, dy)
        da = self.product(dy, np.swapaxes(ctx.b, -1, -2)) if ctx.needs(0) else None
        db = self.product(np.swapaxes(ctx.a, -1, -2), dy) if ctx.needs(1) else None
        return (da, db)

    @staticmethod
    def product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """a @ b for (..., M, K) and (..., K, N) with equal leading dimensions."""
        if a.ndim == 2:
            y = np.empty((a.shape[0], b.shape[1]), np.result_type(a, b))
            native.call_into("gemm_into", a, b, out=y, trans_a=False, trans_b=False,
                             alpha=1.0, beta=0.0)
            return y
        batch = a.shape[:-2]
        y = native.call("batched_matmul", a.reshape(-1, *a.shape[-2:]),
                        b.reshape(-1, *b.shape[-2:]))
        return y.reshape(*batch, *y.shape[-2:])
