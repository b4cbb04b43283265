"""SequenceLength (ONNX opset 11+): the number of tensors in a sequence, int64 scalar."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._sequence import check_sequence


@register("SequenceLength", since=11)
class SequenceLength(Operator):
    """ONNX SequenceLength-11: produces a scalar(tensor of empty shape) containing the number of
    tensors in 'input_sequence'."""
    no_grad_inputs = (0,)

    def forward(self, ctx, sequence):
        return np.array(len(check_sequence(sequence, "SequenceLength")), np.int64)
