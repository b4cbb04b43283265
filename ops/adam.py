"""Adam (ai.onnx.preview.training opset 1): for each tensor, ``g' = norm_coefficient * x +
g``, ``v' = alpha v + (1 - alpha) g'``, ``h' = beta h + (1 - beta) g'^2``, the rate corrected
by ``sqrt(1 - beta^t) / (1 - alpha^t)`` when t > 0, ``x' = (1 - norm_coefficient_post)
(x - r' v' / (sqrt(h') + epsilon))``. Outputs the new tensors, then the v's, then the h's."""

from __future__ import annotations

import numpy as np

from ._training import TrainingOptimizer, register_training


@register_training("Adam")
class Adam(TrainingOptimizer):
    """ai.onnx.preview.training Adam-1: compute one iteration of Adam, a stochastic gradient
    based optimization algorithm."""
    attributes = {"alpha": 0.9, "beta": 0.999, "epsilon": 0.0, "norm_coefficient": 0.0,
                  "norm_coefficient_post": 0.0}
    states = 2

    def rule(self, r, t, x, g, v, h):
        a, b = self.alpha, self.beta
        g = self.norm_coefficient * x + g
        v_new = a * v + (1 - a) * g
        h_new = b * h + (1 - b) * g * g
        rate = r * np.sqrt(1 - b ** t) / (1 - a ** t) if t > 0 else r
        x_new = (1 - self.norm_coefficient_post) * (x - rate * v_new / (np.sqrt(h_new)
                                                                          + self.epsilon))
        return x_new, v_new, h_new
