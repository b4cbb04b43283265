"""Forward checks of RNN, GRU and LSTM where onnx.reference cannot help (it ignores
sequence_lens, clip, activations and input_forget): a plain loop written from the ONNX spec,
and the defining property of sequence_lens."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import Context
from meta.ops.gru import GRU
from meta.ops.lstm import LSTM
from meta.ops.rnn import RNN

rng = np.random.default_rng(5)
T, B, IN, H = 4, 3, 2, 3


def sig(z):
    return 1 / (1 + np.exp(-z))


def r(*shape):
    return rng.standard_normal(shape) * 0.7


def lstm_loop(x, w, rr, b, h, c, p, clip=None, input_forget=0):
    clip = None if clip is None else float(np.float32(clip))  # ONNX attributes are float32
    cl = (lambda z: np.clip(z, -clip, clip)) if clip else (lambda z: z)
    wb, rb = b[:4 * H], b[4 * H:]
    ys = []
    for t in range(x.shape[0]):
        pre = x[t] @ w.T + h @ rr.T + wb + rb
        pi, po, pf, pc = np.split(pre, 4, axis=1)
        i = sig(cl(pi + p[:H] * c))
        f = 1 - i if input_forget else sig(cl(pf + p[2 * H:] * c))
        c = f * c + i * np.tanh(cl(pc))
        o = sig(cl(po + p[H:2 * H] * c))
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys), h, c


@pytest.mark.parametrize("attrs", [{"clip": 0.4}, {"input_forget": 1},
                                   {"clip": 0.5, "input_forget": 1}])
def test_lstm_clip_and_input_forget_follow_the_spec(attrs):
    x, w, rr, b = r(T, B, IN), r(1, 4 * H, IN), r(1, 4 * H, H), r(1, 8 * H)
    h0, c0, p = r(1, B, H), r(1, B, H), r(1, 3 * H)
    y, yh, yc = LSTM(hidden_size=H, **attrs).apply(Context(), x, w, rr, b, None, h0, c0, p)
    ey, eh, ec = lstm_loop(x, w[0], rr[0], b[0], h0[0], c0[0], p[0], attrs.get("clip"),
                           attrs.get("input_forget", 0))
    np.testing.assert_allclose(y[:, 0], ey, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(yh[0], eh, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(yc[0], ec, rtol=1e-12, atol=1e-14)


def test_rnn_activation_and_clip_follow_the_spec():
    x, w, rr, b, h = r(T, B, IN), r(1, H, IN), r(1, H, H), r(1, 2 * H), r(1, B, H)
    y, yh = RNN(hidden_size=H, activations=["Relu"], clip=0.5).apply(Context(), x, w, rr, b,
                                                                      None, h)
    state, expected = h[0], []
    for t in range(T):
        state = np.maximum(np.clip(x[t] @ w[0].T + state @ rr[0].T + b[0, :H] + b[0, H:],
                                   -0.5, 0.5), 0)
        expected.append(state)
    np.testing.assert_allclose(y[:, 0], np.stack(expected), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(yh[0], state, rtol=1e-12)


def test_gru_activations_with_alpha_follow_the_spec():
    x, w, rr, b, h = r(T, B, IN), r(1, 3 * H, IN), r(1, 3 * H, H), r(1, 6 * H), r(1, B, H)
    op = GRU(hidden_size=H, activations=["HardSigmoid", "LeakyRelu"], activation_alpha=[0.3, 0.1],
             activation_beta=[0.4])
    y, _ = op.apply(Context(), x, w, rr, b, None, h)
    state = h[0]
    wb, rb = b[0, :3 * H], b[0, 3 * H:]
    alpha_f, beta_f, alpha_g = np.float32(0.3), np.float32(0.4), np.float32(0.1)
    for t in range(T):
        xw = x[t] @ w[0].T + wb
        hr = state @ rr[0].T + rb
        z = np.clip(alpha_f * (xw[:, :H] + hr[:, :H]) + beta_f, 0, 1)
        g = np.clip(alpha_f * (xw[:, H:2 * H] + hr[:, H:2 * H]) + beta_f, 0, 1)
        pre = xw[:, 2 * H:] + (g * state) @ rr[0, 2 * H:].T + rb[2 * H:]
        n = np.where(pre >= 0, pre, alpha_g * pre)
        state = (1 - z) * n + z * state
        np.testing.assert_allclose(y[t, 0], state, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op,gates", [(RNN, 1), (GRU, 3), (LSTM, 4)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_sequence_lens_equals_running_each_sequence_alone(op, gates, direction, layout):
    dirs = 2 if direction == "bidirectional" else 1
    x, w, rr, b = r(T, B, IN), r(dirs, gates * H, IN), r(dirs, gates * H, H), r(dirs, 2 * gates * H)
    states = [r(dirs, B, H)] + ([r(dirs, B, H), r(dirs, 3 * H)] if op is LSTM else [])
    lens = np.array([4, 1, 0], np.int32)
    node = op(hidden_size=H, direction=direction, layout=layout)

    def run(xs, ss, lens_=None):
        if layout:
            xs = np.swapaxes(xs, 0, 1)
            ss = [np.swapaxes(s, 0, 1) if s.ndim == 3 else s for s in ss]
        outs = node.apply(Context(), xs, w, rr, b, lens_, *ss)
        if layout:
            outs = (np.moveaxis(outs[0], 0, 2),) + tuple(np.swapaxes(o, 0, 1) for o in outs[1:])
        return outs

    together = run(x, states, lens)
    for k, n in enumerate(lens):
        alone = run(x[:n, k:k + 1], [s[:, k:k + 1] if s.ndim == 3 else s for s in states])
        np.testing.assert_allclose(together[0][:n, :, k], alone[0][:, :, 0], rtol=1e-12)
        assert not together[0][n:, :, k].any()  # padded steps output zeros
        for got, want in zip(together[1:], alone[1:]):
            np.testing.assert_allclose(got[:, k], want[:, 0], rtol=1e-12)
