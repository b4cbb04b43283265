"""Adagrad (ai.onnx.preview.training opset 1): for each tensor,
``g' = norm_coefficient * x + g``, ``h' = h + g'^2``,
``x' = x - r / (1 + t * decay_factor) * g' / (sqrt(h') + epsilon)``."""

from __future__ import annotations

import numpy as np

from ._training import TrainingOptimizer, register_training


@register_training("Adagrad")
class Adagrad(TrainingOptimizer):
    """ai.onnx.preview.training Adagrad-1: compute one iteration of ADAGRAD, a stochastic
    gradient based optimization algorithm."""
    attributes = {"decay_factor": 0.0, "epsilon": 0.0, "norm_coefficient": 0.0}

    def rule(self, r, t, x, g, h):
        g = self.norm_coefficient * x + g
        h_new = h + g * g
        return x - r / (1 + t * self.decay_factor) * g / (np.sqrt(h_new) + self.epsilon), h_new
