"""The ai.onnx.preview.training optimizers' shared shape: inputs R (learning rate), T (step
count), then n tensors X, n gradients G and n (or 2n) optimizer states; outputs the n new
tensors, then the new states. Each tensor is updated on its own with the same rule."""

from __future__ import annotations

from typing import Callable

import numpy as np

from meta.lv0 import Operator


class TrainingOptimizer(Operator):
    """An ONNX training operator (``ai.onnx.preview.training``): one optimizer step applied to
    each (X, G, state...) group of its inputs; subclasses give the ``rule``."""

    domain = "ai.onnx.preview.training"
    states = 1  # optimizer states per tensor (Adam has 2)
    no_grad_inputs = tuple(range(256))  # all of them: a step is applied, not differentiated

    def rule(self, r: float, t: int, x, g, *state) -> tuple[np.ndarray, ...]:
        """One step for one tensor at learning rate ``r`` and step count ``t``: the new
        ``x`` and the new states."""
        raise NotImplementedError

    def forward(self, ctx, r, t, *tensors):
        per = 2 + self.states
        if len(tensors) % per:
            raise ValueError(f"{self.op_type}: {len(tensors)} inputs after R and T are not "
                             f"{per} groups of X, G and {self.states} state(s) per tensor")
        n = len(tensors) // per
        ctx.save(n_inputs=2 + len(tensors))
        groups = [tensors[i::n] for i in range(n)]  # (x, g, states...) per tensor
        results = [self.rule(np.asarray(r).reshape(()).item(), int(np.asarray(t).reshape(())),
                             *group) for group in groups]
        return tuple(np.asarray(out[k], dtype=groups[i][0].dtype if k == 0 else
                                groups[i][2 + k - 1].dtype)
                     for k in range(1 + self.states) for i, out in enumerate(results))

    def backward(self, ctx, *grads):
        return (None,) * ctx.n_inputs


def register_training(op_type: str) -> Callable:
    from meta.lv0 import register

    return register(op_type, since=1, domain=TrainingOptimizer.domain)
