"""MeanSquaredError (domain ai.meta): (prediction - target)^2, reduced by ``reduction``.

Not an ONNX operator (ONNX spells it Sub, Mul, ReduceMean); one node keeps a regression
graph short and its gradient exact. Both inputs must have the same shape: a silently
broadcast target is a classic bug. Both get a gradient.
"""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._loss import check_reduction, per_element_grad, reduce_loss


@register("MeanSquaredError", since=1, domain="ai.meta")
class MeanSquaredError(Operator):
    """ai.meta MeanSquaredError-1: MeanSquaredError (domain ai.meta): (prediction - target)^2,
    reduced by ``reduction``."""
    attributes = {"reduction": "mean"}

    def forward(self, ctx, prediction, target):
        check_reduction(self.op_type, self.reduction)
        if prediction.shape != target.shape:
            raise ValueError(f"MeanSquaredError: prediction of shape {prediction.shape} and "
                             f"target of shape {target.shape} differ")
        diff = prediction - target
        ctx.save(diff=diff)
        return reduce_loss(diff * diff, self.reduction, max(diff.size, 1))

    def backward(self, ctx, dloss):
        diff = ctx.diff
        dpred = 2 * diff * per_element_grad(dloss, self.reduction, diff.shape, max(diff.size, 1))
        return (dpred if ctx.needs(0) else None, -dpred if ctx.needs(1) else None)
