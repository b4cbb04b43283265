"""NegativeLogLikelihoodLoss (ONNX opset 12+): -input[n, target[n, d...], d...] per element.

Inputs: log-probabilities (N, C, d1...), int targets (N, d1...), optional class weights (C).
Each element's loss is scaled by its class weight; elements whose target is ``ignore_index``
count for nothing. ``mean`` divides by the total weight of the counted elements (their number
when there are no weights).
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._loss import check_reduction, per_element_grad, reduce_loss


@register("NegativeLogLikelihoodLoss", since=12)
class NegativeLogLikelihoodLoss(Operator):
    """ONNX NegativeLogLikelihoodLoss-12: A NegativeLogLikelihoodLoss operator computes
    (weighted) negative log likelihood loss."""
    attributes = {"ignore_index": None, "reduction": "mean"}

    def forward(self, ctx, x, target, weight=None):
        op = self.op_type
        check_reduction(op, self.reduction)
        if x.ndim < 2 or target.shape != x.shape[:1] + x.shape[2:]:
            raise ValueError(f"{op}: target of shape {target.shape} does not match input of "
                             f"shape {x.shape} (expected {x.shape[:1] + x.shape[2:]})")
        n_classes = x.shape[1]
        if weight is not None and weight.shape != (n_classes,):
            raise ValueError(f"{op}: weight of shape {weight.shape} for {n_classes} classes")
        ignored = None if self.ignore_index is None else target == self.ignore_index
        safe = target if ignored is None else np.where(ignored, 0, target)
        if safe.size and (safe.min() < 0 or safe.max() >= n_classes):
            raise IndexError(f"{op}: targets must lie in [0, {n_classes - 1}] (or be the "
                             f"ignore_index), got [{safe.min()}, {safe.max()}]")
        picked = np.take_along_axis(x, np.expand_dims(safe, 1), axis=1).squeeze(1)
        # Per-element weight: the class weight, 0 where ignored; None means all ones.
        w = None if weight is None else weight[safe]
        if ignored is not None:
            w = np.where(ignored, 0, 1 if w is None else w).astype(x.dtype)
        loss = -picked if w is None else -picked * w
        denom = float(loss.size if w is None else w.sum())
        out = reduce_loss(loss, self.reduction, denom)
        ctx.save(safe=safe, w=w, denom=denom, shape=x.shape, ignored=ignored,
                 picked=picked if weight is not None else None,
                 out=out if weight is not None else None)
        return out

    def backward(self, ctx, dloss):
        safe, w = ctx.safe, ctx.w
        coeff = per_element_grad(dloss, self.reduction, safe.shape, ctx.denom)
        if w is not None:
            coeff = coeff * w
        dx = None
        if ctx.needs(0):
            dx = np.zeros(ctx.shape, dloss.dtype)
            np.put_along_axis(dx, np.expand_dims(safe, 1), -np.expand_dims(coeff, 1), axis=1)
        dweight = None
        if ctx.picked is not None and ctx.needs(2):
            # loss = sum(-picked * w) [/ sum(w)], with w_i = weight[target_i] (0 if ignored).
            if self.reduction == "mean":
                per = (-ctx.picked - ctx.out) / ctx.denom * dloss
            else:
                per = -ctx.picked * per_element_grad(dloss, self.reduction, safe.shape, 1.0)
            counted = np.ones(safe.shape, bool) if ctx.ignored is None else ~ctx.ignored
            dweight = np.bincount(safe[counted], weights=per[counted],
                                  minlength=ctx.shape[1]).astype(dloss.dtype)
        return (dx, None, dweight)
