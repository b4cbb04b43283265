"""Momentum (ai.onnx.preview.training opset 1): for each tensor, ``g' = norm_coefficient * x
+ g``, ``v' = alpha v + beta' g'`` (beta' = 1 on the first step, t = 0), then ``x' = x - r
v'`` (mode standard) or ``x' = x - r (g' + alpha v')`` (mode nesterov)."""

from __future__ import annotations

from ._training import TrainingOptimizer, register_training


@register_training("Momentum")
class Momentum(TrainingOptimizer):
    """ai.onnx.preview.training Momentum-1: compute one iteration of stochastic gradient update
    with momentum."""
    attributes = {"alpha": None, "beta": None, "mode": None, "norm_coefficient": None}

    def rule(self, r, t, x, g, v):
        if None in (self.alpha, self.beta, self.mode, self.norm_coefficient):
            raise ValueError("Momentum: alpha, beta, mode and norm_coefficient are required")
        g = self.norm_coefficient * x + g
        v_new = self.alpha * v + (self.beta if t > 0 else 1) * g
        if self.mode == "standard":
            return x - r * v_new, v_new
        if self.mode == "nesterov":
            return x - r * (g + self.alpha * v_new), v_new
        raise ValueError(f"Momentum: unknown mode {self.mode!r} (standard or nesterov)")
