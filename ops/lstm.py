"""LSTM: long short-term memory (ONNX opset 7+; 14 added ``layout``). Gates in ONNX's order
i, o, f, c; optional peepholes P = [Pi, Po, Pf]; ``input_forget`` couples the forget gate to
the input gate (f = 1 - i):

    i = f(x Wi + h Ri + Pi * c + bi)     f_ = f(x Wf + h Rf + Pf * c + bf)
    c~ = g(x Wc + h Rc + bc)             c' = f_ * c + i * c~
    o = f(x Wo + h Ro + Po * c' + bo)    h' = o * h(c')

Directions, sequence lengths, activations, clipping and backpropagation through time:
ops/_recurrent.py.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._recurrent import Params, Recurrent


@register("LSTM", since=7)
class LSTM(Recurrent):
    """ONNX LSTM-7: computes an one-layer LSTM."""
    gates = 4
    n_states = 2
    clipped = 2  # clip bounds the gates' inputs, not the cell state h() reads
    default_activations = ["Sigmoid", "Tanh", "Tanh"]
    attributes = {**Recurrent.attributes, "input_forget": 0}

    def _peepholes(self, p: Params, dtype):
        n_h = p.hidden
        if p.P is None:
            zero = np.zeros(n_h, dtype)
            return zero, zero, zero
        return p.P[:n_h], p.P[n_h:2 * n_h], p.P[2 * n_h:]

    def step(self, x, state, p: Params):
        h_prev, c_prev = state
        n_h = p.hidden
        f, g, h_act = p.acts
        pi, po, pf = self._peepholes(p, x.dtype)
        pre = x @ p.W.T + h_prev @ p.R.T + p.Wb + p.Rb
        pre_i = pre[:, :n_h] + pi * c_prev
        pre_f = pre[:, 2 * n_h:3 * n_h] + pf * c_prev
        pre_c = pre[:, 3 * n_h:]
        i = f(pre_i)
        fg = 1 - i if self.input_forget else f(pre_f)
        cand = g(pre_c)
        c = fg * c_prev + i * cand
        pre_o = pre[:, n_h:2 * n_h] + po * c
        o = f(pre_o)
        hc = h_act(c)
        h = o * hc
        return (h, c), (x, h_prev, c_prev, pre_i, i, pre_f, fg, pre_c, cand, c, pre_o, o, hc)

    def step_back(self, d_state, cache, p: Params, grads):
        x, h_prev, c_prev, pre_i, i, pre_f, fg, pre_c, cand, c, pre_o, o, hc = cache
        n_h = p.hidden
        f, g, h_act = p.acts
        pi, po, pf = self._peepholes(p, x.dtype)
        dh, dc = d_state
        dpre_o = f.grad(pre_o, o, dh * hc)
        dc = dc + h_act.grad(c, hc, dh * o) + dpre_o * po
        di = dc * cand
        dfg = dc * c_prev
        dc_prev = dc * fg
        if self.input_forget:
            di = di - dfg
            dpre_f = np.zeros_like(dfg)
        else:
            dpre_f = f.grad(pre_f, fg, dfg)
        dpre_i = f.grad(pre_i, i, di)
        dpre_c = g.grad(pre_c, cand, dc * i)
        dc_prev = dc_prev + dpre_i * pi + dpre_f * pf
        if p.P is not None:
            grads["P"][:n_h] += (dpre_i * c_prev).sum(axis=0)
            grads["P"][n_h:2 * n_h] += (dpre_o * c).sum(axis=0)
            grads["P"][2 * n_h:] += (dpre_f * c_prev).sum(axis=0)
        dpre = np.concatenate([dpre_i, dpre_o, dpre_f, dpre_c], axis=1)
        grads["W"] += dpre.T @ x
        grads["R"] += dpre.T @ h_prev
        grads["Wb"] += dpre.sum(axis=0)
        grads["Rb"] += dpre.sum(axis=0)
        return dpre @ p.W, (dpre @ p.R, dc_prev)
