"""If (ONNX opsets 1+): run ``then_branch`` or ``else_branch`` and return its outputs.

A branch reads tensors of the enclosing graph by name; the executor hands the node a scope
holding them (``ctx.subgraphs``, meta.lv1.executor.SubgraphScope), which runs the branch and
backpropagates through it: gradients reach the enclosing tensors the branch read, the
condition has none.
"""

from __future__ import annotations

from meta.lv0 import Operator, register


@register("If", since=1)
class If(Operator):
    """ONNX If-1: If conditional."""
    attributes = {"then_branch": None, "else_branch": None}
    no_grad_inputs = (0,)

    def forward(self, ctx, cond):
        branch = self.then_branch if bool(cond.reshape(-1)[0]) else self.else_branch
        outputs, record = ctx.subgraphs.run(branch, [])
        ctx.save(record=record)
        return tuple(outputs)

    def backward(self, ctx, *grad_outputs):
        ctx.subgraphs.backward(ctx.record, grad_outputs)
        return (None,)
