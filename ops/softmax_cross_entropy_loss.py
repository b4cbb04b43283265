"""SoftmaxCrossEntropyLoss (ONNX opset 12+): log-softmax over axis 1, then negative log-likelihood.

Inputs: scores (N, C, d1...), labels (N, d1...) of int, optional weights (C). Outputs: the loss
(reduced by ``reduction``) and, optionally, the log-probabilities.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


@register("SoftmaxCrossEntropyLoss", since=12)
class SoftmaxCrossEntropyLoss(Operator):
    attributes = {"ignore_index": None, "reduction": "mean"}

    def forward(self, ctx, scores, labels, weights=None):
        if self.reduction not in ("mean", "sum", "none"):
            raise ValueError(f"SoftmaxCrossEntropyLoss: unknown reduction {self.reduction!r}")
        if labels.shape != scores.shape[:1] + scores.shape[2:]:
            raise ValueError(
                f"SoftmaxCrossEntropyLoss: labels of shape {labels.shape} do not match scores "
                f"of shape {scores.shape} (expected {scores.shape[:1] + scores.shape[2:]})"
            )
        logp = log_softmax(scores, axis=1)
        ignored = (labels == self.ignore_index) if self.ignore_index is not None else None
        safe = np.where(ignored, 0, labels) if ignored is not None else labels
        picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1).squeeze(1)
        # Per-element weight: the class weight, 0 where ignored; None means all ones.
        w = None
        if weights is not None:
            w = weights[safe]
        if ignored is not None:
            w = np.where(ignored, 0, 1 if w is None else w).astype(scores.dtype)
        loss = -picked if w is None else -picked * w
        denom = float(loss.size if w is None else w.sum())
        if self.reduction == "mean":
            out = np.asarray(loss.sum() / denom, dtype=scores.dtype)
        elif self.reduction == "sum":
            out = np.asarray(loss.sum(), dtype=scores.dtype)
        else:
            out = loss.astype(scores.dtype, copy=False)
        ctx.save(logp=logp, safe=safe, w=w, ignored=ignored, picked=picked, denom=denom, out=out,
                 has_weights=weights is not None, n_classes=scores.shape[1])
        return out, logp

    def backward(self, ctx, dloss, dlogp=None):
        logp, safe, w = ctx.logp, ctx.safe, ctx.w
        # d(loss_i)/d(logp_i) = -w_i at the label, then through log-softmax.
        if dloss is None:
            per_elem = np.zeros(safe.shape, dtype=logp.dtype)
        elif self.reduction == "none":
            per_elem = dloss
        else:
            scale = dloss / ctx.denom if self.reduction == "mean" else dloss
            per_elem = np.broadcast_to(scale, safe.shape)
        coeff = per_elem if w is None else per_elem * w
        g_logp = np.zeros_like(logp)
        np.put_along_axis(g_logp, np.expand_dims(safe, 1), -np.expand_dims(coeff, 1), axis=1)
        if dlogp is not None:
            g_logp = g_logp + dlogp
        softmax = np.exp(logp)
        dscores = g_logp - softmax * g_logp.sum(axis=1, keepdims=True)
        dweights = None
        if ctx.has_weights and dloss is not None:
            # loss = sum(-picked * w) [/ sum(w)]; weights enter through w_i = weights[label_i].
            if self.reduction == "mean":
                dw_elem = (-ctx.picked - ctx.out) / ctx.denom * dloss
            else:
                dw_elem = -ctx.picked * dloss
            if ctx.ignored is not None:
                dw_elem = np.where(ctx.ignored, 0, dw_elem)
            dweights = np.bincount(
                safe.reshape(-1), weights=dw_elem.reshape(-1), minlength=ctx.n_classes
            ).astype(logp.dtype)
        elif ctx.has_weights:
            dweights = np.zeros(ctx.n_classes, dtype=logp.dtype)
        return (dscores.astype(logp.dtype, copy=False), None, dweights)
