"""GRU: the gated recurrent unit (ONNX opset 7+; 14 added ``layout``). Gates in ONNX's order
z (update), r (reset), h; ``linear_before_reset`` applies the reset gate after the recurrent
product (PyTorch's GRU is linear_before_reset=1):

    z = f(x Wz + h Rz + bz)   r = f(x Wr + h Rr + br)
    n = g(x Wh + (r * h) Rh + Rbh + Wbh)        (linear_before_reset = 0)
    n = g(x Wh + Wbh + r * (h Rh + Rbh))        (linear_before_reset = 1)
    h' = (1 - z) * n + z * h

Directions, sequence lengths, activations, clipping and backpropagation through time:
ops/_recurrent.py.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import register

from ._recurrent import Params, Recurrent


@register("GRU", since=7)
class GRU(Recurrent):
    """ONNX GRU-7: computes an one-layer GRU."""
    gates = 3
    default_activations = ["Sigmoid", "Tanh"]
    attributes = {**Recurrent.attributes, "linear_before_reset": 0}

    def step(self, x, state, p: Params):
        (h_prev,) = state
        n_h = p.hidden
        f, g = p.acts
        xw = x @ p.W.T + p.Wb
        rz = slice(0, 2 * n_h)
        hr = h_prev @ p.R[rz].T + p.Rb[rz]
        pre_z = xw[:, :n_h] + hr[:, :n_h]
        pre_r = xw[:, n_h:2 * n_h] + hr[:, n_h:]
        z, r = f(pre_z), f(pre_r)
        rh, rbh = p.R[2 * n_h:], p.Rb[2 * n_h:]
        if self.linear_before_reset:
            q = h_prev @ rh.T + rbh
            pre_n = xw[:, 2 * n_h:] + r * q
        else:
            q = None
            pre_n = xw[:, 2 * n_h:] + (r * h_prev) @ rh.T + rbh
        n = g(pre_n)
        h = (1 - z) * n + z * h_prev
        return (h,), (x, h_prev, pre_z, z, pre_r, r, pre_n, n, q)

    def step_back(self, d_state, cache, p: Params, grads):
        x, h_prev, pre_z, z, pre_r, r, pre_n, n, q = cache
        n_h = p.hidden
        f, g = p.acts
        (dh,) = d_state
        dn = dh * (1 - z)
        dz = dh * (h_prev - n)
        dh_prev = dh * z
        dpre_n = g.grad(pre_n, n, dn)
        rh = p.R[2 * n_h:]
        if self.linear_before_reset:
            dq = dpre_n * r
            dr = dpre_n * q
            grads["R"][2 * n_h:] += dq.T @ h_prev
            grads["Rb"][2 * n_h:] += dq.sum(axis=0)
            dh_prev = dh_prev + dq @ rh
        else:
            grads["R"][2 * n_h:] += dpre_n.T @ (r * h_prev)
            grads["Rb"][2 * n_h:] += dpre_n.sum(axis=0)
            drh = dpre_n @ rh
            dr = drh * h_prev
            dh_prev = dh_prev + drh * r
        dpre_zr = np.concatenate([f.grad(pre_z, z, dz), f.grad(pre_r, r, dr)], axis=1)
        grads["R"][:2 * n_h] += dpre_zr.T @ h_prev
        grads["Rb"][:2 * n_h] += dpre_zr.sum(axis=0)
        dh_prev = dh_prev + dpre_zr @ p.R[:2 * n_h]
        dpre = np.concatenate([dpre_zr, dpre_n], axis=1)
        grads["W"] += dpre.T @ x
        grads["Wb"] += dpre.sum(axis=0)
        return dpre @ p.W, (dh_prev,)
