"""ArgMax / ArgMin: the index of the first (or, with ``select_last_index``, last) extreme
along ``axis``, int64 (ONNX opset 1+; 11 negative axes, 12 select_last_index)."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator

from ._axes import normalize_axis


class ArgExtreme(Operator):
    attributes = {"axis": 0, "keepdims": 1, "select_last_index": 0}
    no_grad_inputs = (0,)
    largest = True

    def forward(self, ctx, x):
        axis = normalize_axis(self.axis, x.ndim, self.op_type)
        pick = np.argmax if self.largest else np.argmin
        if self.select_last_index:
            idx = x.shape[axis] - 1 - pick(np.flip(x, axis), axis=axis)
        else:
            idx = pick(x, axis=axis)
        idx = np.asarray(idx, dtype=np.int64)
        return np.expand_dims(idx, axis) if self.keepdims else idx

    def backward(self, ctx, dy):
        return (None,)
