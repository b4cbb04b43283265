"""Test cases for Attention and the other transformer-era operators (see cases.py)."""

from __future__ import annotations

from typing import Callable

import numpy as np
from onnx import TensorProto

from .cases_nn import OracleLimit


def attention(rng):
    r = rng.standard_normal
    q, k, v = r((2, 3, 4, 5)), r((2, 3, 6, 5)), r((2, 3, 6, 4))
    q3, k3, v3 = r((2, 4, 6)), r((2, 5, 6)), r((2, 5, 4))
    gq, gk, gv = r((1, 4, 3, 2)), r((1, 2, 5, 2)), r((1, 2, 5, 3))
    pk, pv = r((1, 2, 2, 2)), r((1, 2, 2, 3))
    float_mask = r((4, 5))  # one key short: padded as masked
    # (onnx.reference takes sqrt(scale) in float32: scales here have exact square roots)
    bool_mask = rng.random((2, 1, 4, 6)) > 0.3
    bool_mask[..., 0] = True  # every row sees a key
    rows_masked = np.ones((4, 6), bool)
    rows_masked[1] = False  # a fully masked query row gets zeros
    every = range(23, 100)
    return [
        ({}, [q, k, v], every),
        ({"q_num_heads": 2, "kv_num_heads": 2}, [q3, k3, v3], every),
        ({"scale": 0.25, "qk_matmul_output_mode": 1}, [gq, gk, gv], every),  # grouped query
        ({"is_causal": 1}, [gq, gk, gv, None, pk, pv], every),
        ({}, [q, k, v, float_mask], every),
        ({"qk_matmul_output_mode": 2}, [q, k, v, r((2, 1, 4, 6))], every),
        ({"qk_matmul_output_mode": 3, "softcap": 2.0, "scale": 0.25}, [q, k, v, bool_mask],
         every),
        ({"is_causal": 1, "softmax_precision": TensorProto.DOUBLE},
         [q, k, v, r((4, 6))], every),
        ({"qk_matmul_output_mode": 3}, [q, k, v, rows_masked], every),
        ({"is_causal": 1}, [q, k, v, None, None, None, np.array([5, 6], np.int64)],
         range(24, 100)),
        ({"left_window_size": 1, "right_window_size": 2}, [q, k, v], range(25, 100)),
        ({"left_window_size": 0, "is_causal": 1, "q_num_heads": 2, "kv_num_heads": 2},
         [q3, k3, v3], range(25, 100)),
    ]


def rotary_embedding(rng):
    r = rng.standard_normal
    x4, x3 = r((2, 3, 4, 6)), r((2, 4, 12))
    cos, sin = r((2, 4, 3)), r((2, 4, 3))
    table_cos, table_sin = r((10, 2)), r((10, 2))
    positions = np.array([[0, 3, 3, 9], [1, 2, 5, 0]], np.int64)
    return [({}, [x4, cos, sin]), ({"interleaved": 1}, [x4, cos, sin]),
            ({"num_heads": 2}, [x3, cos, sin]),
            ({"rotary_embedding_dim": 4, "num_heads": 2, "interleaved": 1},
             [x3, table_cos, table_sin, positions]),
            ({"rotary_embedding_dim": 4}, [x4, table_cos, table_sin, positions])]


def center_crop_pad(rng):
    x = rng.standard_normal((3, 5, 4))
    return [({}, [x, np.array([2, 6, 4], np.int64)]),
            ({"axes": [-1, 1]}, [x, np.array([7, 2], np.int64)]),
            ({"axes": [0]}, [x, np.array([1], np.int64)])]


def affine_grid(rng):
    # values exact in float32, so the float32 oracle agrees to the last bit
    theta2 = (rng.integers(-4, 5, (2, 2, 3)) / 4).astype(np.float32)
    theta3 = (rng.integers(-4, 5, (1, 3, 4)) / 4).astype(np.float32)
    return [({}, [theta2, np.array([2, 3, 4, 2], np.int64)]),
            ({"align_corners": 1}, [theta2, np.array([2, 1, 5, 3], np.int64)]),
            ({}, [theta3, np.array([1, 1, 2, 4, 2], np.int64)]),
            ({"align_corners": 1}, [theta3, np.array([1, 1, 3, 2, 5], np.int64)])]


def bit_cast(rng):
    # (no float32 input: the gradient check widens float inputs to float64)
    return [({"to": TensorProto.FLOAT}, [np.array(1065353216, np.int32)]),
            ({"to": TensorProto.UINT8}, [np.array([True, False])]),
            ({"to": TensorProto.INT64}, [rng.standard_normal(4)])]


def tensor_scatter(rng):
    cache, update = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 2, 4))
    return [({}, [cache, update]), ({}, [cache, update, np.array([1, 3], np.int64)]),
            ({"mode": "circular"}, [cache, update, np.array([4, 2], np.int64)]),
            ({"axis": 1}, [cache, rng.standard_normal((2, 2, 5, 4)), np.array([0, 1])])]


def swi_glu(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    return [({}, [a, b]), ({"alpha": 1.5}, [a, b])]


def causal_conv_with_state(rng):
    x, w = rng.standard_normal((2, 3, 5)), rng.standard_normal((3, 1, 3))
    silu = OracleLimit({"activation": "silu"}, 0, "onnx.reference computes SiLU in float32")
    return [({}, [x, w]), ({}, [x, w, rng.standard_normal(3), rng.standard_normal((2, 3, 2))]),
            (silu, [x, w, rng.standard_normal(3)]),
            (OracleLimit({"activation": "swish"}, 0, silu.reason),
             [x, rng.standard_normal((3, 1, 1))])]


def linear_attention(rng):
    """onnx.reference runs the recurrence in float32: tests/lv0/test_attention_ops.py compares
    with it at float32 tolerance."""
    r = rng.standard_normal
    b, t, hq, hk, dk, dv = 2, 3, 4, 2, 3, 2
    q, k, v = r((b, t, hq * dk)) * 0.5, r((b, t, hk * dk)) * 0.5, r((b, t, hk * dv))
    past = r((b, hk, dk, dv)) * 0.5
    decay_head, decay_row = -rng.uniform(0.1, 1, (b, t, hk)), -rng.uniform(0.1, 1, (b, t, hk * dk))
    beta_head, beta_one = rng.uniform(0.2, 1, (b, t, hk)), rng.uniform(0.2, 1, (b, t, 1))
    heads = {"q_num_heads": hq, "kv_num_heads": hk}
    f32 = "onnx.reference runs LinearAttention in float32"

    def case(rule, inputs, **extra):
        return (OracleLimit({**heads, "update_rule": rule, **extra}, 0, f32), inputs)
    return [case("linear", [q, k, v]), case("linear", [q, k, v, past], scale=0.5),
            case("gated", [q, k, v, past, decay_head]),
            case("gated", [q, k, v, None, decay_row]),
            case("delta", [q, k, v, past, None, beta_head]),
            case("delta", [q, k, v, None, None, beta_one]),
            case("gated_delta", [q, k, v, past, decay_row, beta_head]),
            case("gated_delta", [q, k, v, past, decay_head, beta_one])]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "CausalConvWithState": causal_conv_with_state, "LinearAttention": linear_attention,
    "Attention": attention, "RotaryEmbedding": rotary_embedding,
    "CenterCropPad": center_crop_pad, "AffineGrid": affine_grid, "BitCast": bit_cast,
    "TensorScatter": tensor_scatter, "SwiGLU": swi_glu,
}
