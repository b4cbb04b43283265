"""RNN: the simple recurrent network, h_t = f(x_t W^T + h_{t-1} R^T + Wb + Rb) (ONNX opset 7+;
14 added ``layout``). Directions, sequence lengths, activations and clipping: ops/_recurrent.py,
which also backpropagates through time."""

from __future__ import annotations

from meta.lv0 import register

from ._recurrent import Params, Recurrent


@register("RNN", since=7)
class RNN(Recurrent):
    """ONNX RNN-7: computes an one-layer simple RNN."""
    gates = 1
    default_activations = ["Tanh"]

    def step(self, x, state, p: Params):
        (h_prev,) = state
        z = x @ p.W.T + h_prev @ p.R.T + p.Wb + p.Rb
        h = p.acts[0](z)
        return (h,), (x, h_prev, z, h)

    def step_back(self, d_state, cache, p: Params, grads):
        x, h_prev, z, h = cache
        dz = p.acts[0].grad(z, h, d_state[0])
        grads["W"] += dz.T @ x
        grads["R"] += dz.T @ h_prev
        grads["Wb"] += dz.sum(axis=0)
        grads["Rb"] += dz.sum(axis=0)
        return dz @ p.W, (dz @ p.R,)
