"""SequenceAt (ONNX opset 11+): the tensor at ``position`` (negative counts from the end)."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._sequence import check_sequence, position


@register("SequenceAt", since=11)
class SequenceAt(Operator):
    no_grad_inputs = (0, 1)

    def forward(self, ctx, sequence, where):
        seq = check_sequence(sequence, "SequenceAt")
        return seq[position(where, len(seq), "SequenceAt")]
