"""Upsample (ONNX opsets 7-9; deprecated in 10 for Resize): nearest or N-linear enlargement by
``scales`` (>= 1 per axis; an attribute at 7, an input from 9), output length
``floor(length * scale)``, asymmetric coordinates. Backward w.r.t. X as Resize's."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._resize import axis_plan, is_identity, resample, resample_backward


@register("Upsample", since=9)
class Upsample(Operator):
    """ONNX Upsample-9: Upsample the input tensor."""
    attributes = {"mode": "nearest"}
    no_grad_inputs = (1,)

    def plans(self, shape, scales):
        scales = [float(s) for s in np.reshape(scales, -1)]
        if len(scales) != len(shape):
            raise ValueError(f"Upsample: scales {scales} must have one value per axis of X "
                             f"{list(shape)}")
        if any(s < 1 for s in scales):
            raise ValueError(f"Upsample: scales {scales} must be >= 1 (Resize shrinks)")
        mode = {"bilinear": "linear", "trilinear": "linear"}.get(self.mode, self.mode)
        plans = []
        for axis, (n, s) in enumerate(zip(shape, scales)):
            out = int(np.float64(s) * n)
            if not is_identity(n, out, s, None):
                plans.append(axis_plan(axis, n, out, s, mode=mode, coordinate_mode="asymmetric",
                                       nearest_mode="simple"))
        return plans

    def forward(self, ctx, x, scales):
        plans = self.plans(x.shape, scales)
        ctx.save(plans=plans)
        return resample(x, plans)

    def backward(self, ctx, dy):
        dx = resample_backward(dy, ctx.plans) if ctx.needs(0) and dy is not None else None
        return (dx, None)


@register("Upsample", since=7)
class Upsample7(Upsample):
    """Opset 7: ``scales`` is an attribute."""

    attributes = {"mode": "nearest", "scales": None}
    no_grad_inputs = ()

    def forward(self, ctx, x):
        if self.scales is None:
            raise ValueError("Upsample: the scales attribute is required at opset 7")
        return super().forward(ctx, x, np.asarray(self.scales, np.float32))

    def backward(self, ctx, dy):
        return super().backward(ctx, dy)[:1]
