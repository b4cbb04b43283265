"""Dropout (ONNX opset 12+; 13 only widened the types): ratio and training_mode are inputs.
Opsets 6-11 (``ratio`` an attribute, 6 with ``is_test``) are registered below.

Inference (the default) is the identity; the executor's mode (``ctx.mode``) overrides the
``training_mode`` input, so ``executor.train()`` drops and ``executor.eval()`` does not. In
training each element is kept with probability ``1 - ratio`` and scaled by
``1 / (1 - ratio)``; the mask is the second output. With the
``seed`` attribute every call draws the same mask, exactly as onnx.reference does
(``RandomState(seed).uniform(0, 1, shape) >= ratio``), so runs and gradient checks are
reproducible; without it each instance keeps its own generator and draws a fresh mask per call.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


@register("Dropout", since=12)
class Dropout(Operator):
    """ONNX Dropout-12: Dropout takes an input floating-point tensor, an optional input ratio
    (floating-point scalar) and an optional input training_mode (boolean scalar)."""
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


# -- opsets 6-11 ------------------------------------------------------------------------------
@register("Dropout", since=10)
class Dropout10(Dropout):
    """Opsets 10-11: ``ratio`` is an attribute and there is no ``training_mode`` input: as
    written the node is the identity (inference), the executor's ``train()`` makes it drop.
    The optional mask output is bool."""

    attributes = {"ratio": 0.5}
    no_grad_inputs = ()
    seed = None

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return attrs, inputs, outputs

    def as_written(self) -> bool:
        return False

    def forward(self, ctx, x):
        return super().forward(ctx, x, np.float32(self.ratio), np.bool_(self.as_written()))

    def backward(self, ctx, dy, dmask=None):
        return super().backward(ctx, dy, dmask)[:1]


@register("Dropout", since=7)
class Dropout7(Dropout10):
    """Opsets 7-9: opset 10 with the mask in X's type."""

    def forward(self, ctx, x):
        y, mask = super().forward(ctx, x)
        return y, mask.astype(x.dtype)


@register("Dropout", since=6)
class Dropout6(Dropout7):
    """Opset 6: opset 7 plus ``is_test``; with the default ``is_test=0`` the node drops as
    written (the executor's mode overrides it either way)."""

    attributes = {"ratio": 0.5, "is_test": 0}

    @classmethod
    def inference_form(cls, attrs, inputs, outputs):
        return {**attrs, "is_test": 1}, inputs, outputs

    def as_written(self) -> bool:
        return not self.is_test
