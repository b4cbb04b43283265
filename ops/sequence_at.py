"""SequenceAt (ONNX opset 11+): the tensor at ``position`` (negative counts from the end)."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._sequence import SequenceGrad, check_sequence, position


@register("SequenceAt", since=11)
class SequenceAt(Operator):
    """ONNX SequenceAt-11: outputs a tensor copy from the tensor at 'position' in
    'input_sequence'."""
    no_grad_inputs = (1,)

    def forward(self, ctx, sequence, where):
        seq = check_sequence(sequence, "SequenceAt")
        at = position(where, len(seq), "SequenceAt")
        ctx.save(length=len(seq), at=at)
        return seq[at]

    def backward(self, ctx, dy):
        grad = SequenceGrad([None] * ctx.length)
        grad[ctx.at] = dy
        return grad, None
