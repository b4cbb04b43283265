"""LinearAttention against onnx.reference, which runs the recurrence in float32 (so at float32
tolerance), and Attention's gradients through a float mask and the cache."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Context
from meta.ops.linear_attention import LinearAttention

from .cases import cases_for
from .test_ops import _oracle


def test_linear_attention_matches_onnx_reference_to_float32():
    cases = cases_for("LinearAttention", seed=1, opset=27)
    assert len(cases) >= 6
    for attrs, inputs in cases:
        xs = [None if x is None else x.astype(np.float32) for x in inputs]
        ours = LinearAttention(**attrs).apply(Context(), *xs)
        theirs = _oracle("LinearAttention", dict(attrs), xs, 27, 2)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=str(attrs))
