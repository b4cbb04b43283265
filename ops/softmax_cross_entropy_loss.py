"""SoftmaxCrossEntropyLoss (ONNX opset 12+): log-softmax over axis 1, then the negative
log-likelihood of the labels, exactly as ONNX defines it by those two steps.

Inputs: scores (N, C, d1...), labels (N, d1...) of int, optional class weights (C). Outputs: the
loss (reduced by ``reduction``) and, optionally, the log-probabilities.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Context, Operator, register

from ._softmax import log_softmax
from .negative_log_likelihood_loss import NegativeLogLikelihoodLoss


@register("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(Operator):
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
