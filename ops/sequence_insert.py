"""SequenceInsert (ONNX opset 11+): a copy of the sequence with ``tensor`` inserted at
``position`` (default: at the end; negative counts from the end)."""

from __future__ import annotations

from meta.lv0 import Operator, register

from ._sequence import check_sequence, position


@register("SequenceInsert", since=11)
class SequenceInsert(Operator):
    """ONNX SequenceInsert-11: outputs a tensor sequence that inserts 'tensor' into
    'input_sequence' at 'position'."""
    no_grad_inputs = (0, 1, 2)

    def forward(self, ctx, sequence, tensor, where=None):
        seq = list(check_sequence(sequence, "SequenceInsert"))
        at = len(seq) if where is None else position(where, len(seq), "SequenceInsert", True)
        seq.insert(at, tensor)
        return (seq,)
