"""ConcatFromSequence (ONNX opset 11+): concatenate a sequence's tensors along ``axis``, or
stack them along a new one (``new_axis=1``, axis may then be rank, counting the new one)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import normalize_axis
from ._sequence import check_sequence


@register("ConcatFromSequence", since=11)
class ConcatFromSequence(Operator):
    """ONNX ConcatFromSequence-11: concatenate a sequence of tensors into a single tensor."""
    attributes = {"axis": None, "new_axis": 0}
    no_grad_inputs = (0,)

    def forward(self, ctx, sequence):
        seq = check_sequence(sequence, "ConcatFromSequence")
        if self.axis is None:
            raise ValueError("ConcatFromSequence: the axis attribute is required")
        if not seq:
            raise ValueError("ConcatFromSequence: the sequence is empty")
        rank = seq[0].ndim + (1 if self.new_axis else 0)
        axis = normalize_axis(self.axis, rank, "ConcatFromSequence")
        return np.stack(seq, axis=axis) if self.new_axis else np.concatenate(seq, axis=axis)
