"""Gemm: Y = alpha * A' B' + beta * C, A' and B' optionally transposed (ONNX opset 11+; opsets
7-10, where C is required, are registered too)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, native, register, unbroadcast


@register("Gemm", since=11)
class Gemm(Operator):
    """ONNX Gemm-11: general matrix multiplication, Y = alpha * A' B' + beta * C, where A' and
    B' are A and B transposed when ``transA`` / ``transB`` say so and C (optional) broadcasts."""
    learnable_inputs = (0, 1, 2)  # A or B (either may hold the weight) and C
    attributes = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}

    def operands(self, a, b):
        return (a.T if self.transA else a), (b.T if self.transB else b)

    def forward(self, ctx, a, b, c=None):
        a_, b_ = self.operands(a, b)
        y = a_ @ b_
        if self.alpha != 1.0:
            y *= self.alpha
        if c is not None:
            y += self.beta * c if self.beta != 1.0 else c
        ctx.save(a=a, b=b, c_shape=None if c is None else c.shape)
        return y

    def backward(self, ctx, dy):
        a_, b_ = self.operands(ctx.a, ctx.b)
        g = dy * self.alpha if self.alpha != 1.0 else dy
        da = db = dc = None
        # dA' = g B'^T and dB' = A'^T g; a transposed operand gets the transposed product,
        # computed directly so the result is contiguous.
        if ctx.needs(0):
            da = b_ @ g.T if self.transA else g @ b_.T
        if ctx.needs(1):
            db = g.T @ a_ if self.transB else a_.T @ g
        if ctx.c_shape is not None and ctx.needs(2):
            dc = unbroadcast(dy * self.beta if self.beta != 1.0 else dy, ctx.c_shape)
        return (da, db, dc)


@register("Gemm", since=11, backend="native")
class NativeGemm(Gemm):
    """The same operator with its products through meta::blas::gemm (numpy's BLAS, called from
    C++ with the GIL released): alpha, beta and the broadcast C are folded into the one BLAS call
    instead of extra passes over Y. Other dtypes than float32/float64 take the numpy path."""

    def forward(self, ctx, a, b, c=None):
        if not native.supports(a, b) or a.ndim != 2 or b.ndim != 2:
            return super().forward(ctx, a, b, c)
        m = a.shape[1] if self.transA else a.shape[0]
        n = b.shape[0] if self.transB else b.shape[1]
        y, beta = np.empty((m, n), a.dtype), 0.0
        if c is not None:
            y[...], beta = c, self.beta  # broadcast C, scaled by beta inside the product
        native.call_into("gemm_into", a, b, out=y, trans_a=bool(self.transA),
                         trans_b=bool(self.transB), alpha=self.alpha, beta=beta)
        ctx.save(a=a, b=b, c_shape=None if c is None else c.shape, native=True)
        return y

    def backward(self, ctx, dy):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dy)
        a, b, alpha = ctx.a, ctx.b, self.alpha
        ta, tb = bool(self.transA), bool(self.transB)
        da = db = dc = None
        # Y = op(A) op(B): dop(A) = dY op(B)^T and dop(B) = op(A)^T dY, each written straight
        # into the stored layout of A or B by choosing the operands' transposes.
        if ctx.needs(0):
            da = np.empty(a.shape, dy.dtype)
            if ta:
                native.call_into("gemm_into", b, dy, out=da, trans_a=tb, trans_b=True,
                                 alpha=alpha, beta=0.0)
            else:
                native.call_into("gemm_into", dy, b, out=da, trans_a=False, trans_b=not tb,
                                 alpha=alpha, beta=0.0)
        if ctx.needs(1):
            db = np.empty(b.shape, dy.dtype)
            if tb:
                native.call_into("gemm_into", dy, a, out=db, trans_a=True, trans_b=ta,
                                 alpha=alpha, beta=0.0)
            else:
                native.call_into("gemm_into", a, dy, out=db, trans_a=not ta, trans_b=False,
                                 alpha=alpha, beta=0.0)
        if ctx.c_shape is not None and ctx.needs(2):
            dc = unbroadcast(dy * self.beta if self.beta != 1.0 else dy, ctx.c_shape)
        return (da, db, dc)


@register("Gemm", since=7)
class Gemm7(Gemm):
    """Opsets 7-10: C is required and broadcasts one way to (M, N) (no ``broadcast``
    attribute since 7); computing it as 11 does is the same, a missing C is refused."""

    def forward(self, ctx, a, b, c=None):
        if c is None:
            raise ValueError("Gemm: input C is required before opset 11")
        return super().forward(ctx, a, b, c)


@register("Gemm", since=7, backend="native")
class NativeGemm7(NativeGemm):
    """Gemm (opset 7+) on meta's C++ kernel: the numpy operator's semantics, computed natively."""
    def forward(self, ctx, a, b, c=None):
        if c is None:
            raise ValueError("Gemm: input C is required before opset 11")
        return super().forward(ctx, a, b, c)


@register("Gemm", since=6)
class Gemm6(Gemm7):
    """Opset 6: C broadcasts only with ``broadcast=1``; otherwise it must be (M, N)."""

    attributes = {**Gemm.attributes, "broadcast": 0}

    def forward(self, ctx, a, b, c=None):
        m = a.shape[1] if self.transA else a.shape[0]
        n = b.shape[0] if self.transB else b.shape[1]
        if c is not None and not self.broadcast and c.shape != (m, n):
            raise ValueError(f"Gemm: C {list(c.shape)} must be [{m}, {n}] without broadcast=1 "
                             f"(opset < 7)")
        return super().forward(ctx, a, b, c)
