"""SoftmaxCrossEntropyLoss (ONNX opset 12+): log-softmax over axis 1, then the negative
log-likelihood of the labels, exactly as ONNX defines it by those two steps.

Inputs: scores (N, C, d1...), labels (N, d1...) of int, optional class weights (C). Outputs: the
loss (reduced by ``reduction``) and, optionally, the log-probabilities.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Context, Operator, native, register

from ._elementwise import contiguous
from ._loss import REDUCTIONS
from ._softmax import NATIVE_MAX_SIZE, log_softmax
from .negative_log_likelihood_loss import NegativeLogLikelihoodLoss


@register("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(Operator):
    """ONNX SoftmaxCrossEntropyLoss-12: loss function that measures the softmax cross entropy
    between 'scores' and 'labels'."""
    attributes = {"ignore_index": None, "reduction": "mean"}

    def nll(self) -> NegativeLogLikelihoodLoss:
        inner = NegativeLogLikelihoodLoss(**self.attrs)
        inner.op_type = self.op_type  # its errors then name this operator
        return inner

    def forward(self, ctx, scores, labels, weights=None):
        logp = log_softmax(scores, axis=1)
        nll_ctx = Context([True, False, weights is not None])
        (loss,) = self.nll().apply(nll_ctx, logp, labels, weights)
        ctx.save(logp=logp, nll_ctx=nll_ctx, has_weights=weights is not None)
        return loss, logp

    def backward(self, ctx, dloss, dlogp=None):
        logp = ctx.logp
        g, dweights = np.zeros_like(logp), None
        if dloss is not None:
            g, _, dweights = self.nll().backward(ctx.nll_ctx, dloss)
        elif ctx.has_weights:
            dweights = np.zeros(logp.shape[1], logp.dtype)
        if dlogp is not None:
            g = g + dlogp
        dscores = g - np.exp(logp) * g.sum(axis=1, keepdims=True)  # through log-softmax
        return (dscores, None, dweights)


@register("SoftmaxCrossEntropyLoss", since=12, backend="native")
class NativeSoftmaxCrossEntropyLoss(SoftmaxCrossEntropyLoss):
    """The same operator through cpp/include/meta/softmax.hpp: forward computes the
    log-probabilities and the loss in one pass, backward is softmax minus one-hot, scaled.
    Scores (N, C) up to NATIVE_MAX_SIZE values only (the kernel takes (N, C, d...) too, but
    measured slower than numpy there); class weights, ignore_index, and anything else (integer
    scores, bad shapes or labels: numpy's errors) go the numpy way."""

    def forward(self, ctx, scores, labels, weights=None):
        if (weights is not None or self.ignore_index is not None
                or self.reduction not in REDUCTIONS or not native.supports(scores)
                or scores.ndim != 2 or scores.size > NATIVE_MAX_SIZE
                or labels.dtype.kind not in "iu"
                or labels.shape != scores.shape[:1] + scores.shape[2:]):
            return super().forward(ctx, scores, labels, weights)
        labels64 = np.ascontiguousarray(labels, dtype=np.int64)
        try:
            loss, logp = native.module().softmax_cross_entropy_forward(
                contiguous(scores), labels64, self.reduction)
        except IndexError:  # a label out of range: numpy's error names the op and range
            return super().forward(ctx, scores, labels, weights)
        ctx.save(native=True, logp=logp, labels=labels64)
        return loss, logp

    def backward(self, ctx, dloss, dlogp=None):
        if not getattr(ctx, "native", False):
            return super().backward(ctx, dloss, dlogp)
        logp, labels = ctx.logp, ctx.labels
        if dloss is None:
            coeff = np.zeros(1, logp.dtype)
        else:
            # d(loss)/d(each element's loss), as _loss.per_element_grad gives it
            coeff = dloss / labels.size if self.reduction == "mean" else dloss
            coeff = np.ascontiguousarray(coeff, dtype=logp.dtype).reshape(-1)
        if dlogp is not None:
            dlogp = np.ascontiguousarray(dlogp, dtype=logp.dtype)
        dscores = native.module().softmax_cross_entropy_backward(logp, labels, coeff, dlogp)
        return (dscores, None, None)
