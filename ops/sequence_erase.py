"""SequenceErase (ONNX opset 11+): a copy of the sequence without the tensor at ``position``
(default: the last)."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._sequence import check_sequence, position


@register("SequenceErase", since=11)
class SequenceErase(Operator):
    """ONNX SequenceErase-11: outputs a tensor sequence that removes the tensor at 'position'
    from 'input_sequence'."""
    no_grad_inputs = (0, 1)

    def forward(self, ctx, sequence, where=None):
        seq = list(check_sequence(sequence, "SequenceErase"))
        del seq[len(seq) - 1 if where is None else position(where, len(seq), "SequenceErase")]
        return (seq,)
