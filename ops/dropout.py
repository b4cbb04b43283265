"""Dropout (ONNX opset 12+; 13 only widened the types): ratio and training_mode are inputs.

Inference (the default) is the identity; the executor's mode (``ctx.mode``) overrides the
``training_mode`` input, so ``executor.train()`` drops and ``executor.eval()`` does not. In training each element is kept with probability
``1 - ratio`` and scaled by ``1 / (1 - ratio)``; the mask is the second output. With the
``seed`` attribute every call draws the same mask, exactly as onnx.reference does
(``RandomState(seed).uniform(0, 1, shape) >= ratio``), so runs and gradient checks are
reproducible; without it each instance keeps its own generator and draws a fresh mask per call.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Dropout", since=12)
class Dropout(Operator):
    attributes = {"seed": None}
    no_grad_inputs = (1, 2)  # ratio: a hyperparameter, not learned; training_mode: a flag

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return attrs, inputs[:2], outputs

    def __init__(self, **attrs):
        super().__init__(**attrs)
        self.rng = np.random.default_rng()

    def draw(self, shape: tuple[int, ...], ratio: float) -> np.ndarray:
        if self.seed is not None:
            return np.random.RandomState(int(self.seed)).uniform(0, 1.0, shape) >= ratio
        return self.rng.random(shape, dtype=np.float32) >= ratio

    def forward(self, ctx, x, ratio=None, training_mode=None):
        ratio = 0.5 if ratio is None else float(ratio)
        training = ctx.mode(bool(training_mode) if training_mode is not None else False)
        if not training or ratio == 0:
            ctx.save(mask=None, scale=1.0)
            return x, np.ones(x.shape, dtype=bool)
        if not 0 <= ratio < 1:
            raise ValueError(f"Dropout: ratio must be in [0, 1) in training, got {ratio} "
                             f"(X {list(x.shape)})")
        mask = self.draw(x.shape, ratio)
        scale = 1.0 / (1.0 - ratio)
        ctx.save(mask=mask, scale=scale)
        return (x * mask * scale).astype(x.dtype, copy=False), mask

    def backward(self, ctx, dy, dmask=None):
        if dy is None:
            return (None, None, None)
        if ctx.mask is None:
            return (dy, None, None)
        return ((dy * ctx.mask * ctx.scale).astype(dy.dtype, copy=False), None, None)
