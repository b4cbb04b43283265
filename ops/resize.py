"""Resize (ONNX opsets 10, 11-17 and 18+): nearest, N-linear and N-cubic resampling of any
axes, with every coordinate transformation, ``exclude_outside``, ``antialias``, ``axes`` and
``keep_aspect_ratio_policy``; X of any numeric type. The output size comes from ``sizes``
when given, else ``floor(length * scale)``.

Backward (w.r.t. X, in every mode) applies the transposed resampling matrices
(``ops/_resize.py``); roi, scales and sizes get none.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._resize import axis_plan, is_identity, resample, resample_backward


@register("Resize", since=18)
class Resize(Operator):
    """ONNX Resize-18: Resize the input tensor."""
    attributes = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                  "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75,
                  "exclude_outside": 0, "extrapolation_value": 0.0, "antialias": 0,
                  "axes": None, "keep_aspect_ratio_policy": "stretch"}
    no_grad_inputs = (1, 2, 3)

    def output_size(self, shape, axes, scales, sizes):
        """(scale, output length) for each of ``axes``."""
        if sizes is not None and np.size(sizes):
            sizes = [int(s) for s in np.reshape(sizes, -1)]
            if len(sizes) != len(axes):
                raise ValueError(f"Resize: sizes {sizes} must have one value per axis "
                                 f"{axes} of X {list(shape)}")
            ratios = [s / shape[a] if shape[a] else 1.0 for s, a in zip(sizes, axes)]
            policy = self.keep_aspect_ratio_policy
            if policy == "stretch":
                return list(zip(ratios, sizes))
            if policy not in ("not_larger", "not_smaller"):
                raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
            scale = min(ratios) if policy == "not_larger" else max(ratios)
            return [(scale, int(scale * shape[a] + 0.5)) for a in axes]
        if scales is None or not np.size(scales):
            raise ValueError("Resize: give scales or sizes")
        scales = [float(s) for s in np.reshape(scales, -1)]
        if len(scales) != len(axes):
            raise ValueError(f"Resize: scales {scales} must have one value per axis {axes} of "
                             f"X {list(shape)}")
        if any(s <= 0 for s in scales):
            raise ValueError(f"Resize: scales {scales} must be positive")
        return [(s, int(np.float64(s) * shape[a])) for s, a in zip(scales, axes)]

    def plans(self, shape, roi, scales, sizes, nearest_mode=None, coordinate_mode=None):
        rank = len(shape)
        axes = list(range(rank)) if self.axes is None else [a % rank for a in self.axes]
        roi = None if roi is None or not np.size(roi) else np.reshape(roi, -1).astype(float)
        if roi is not None and roi.size != 2 * len(axes):
            raise ValueError(f"Resize: roi has {roi.size} values for {len(axes)} axes (starts, "
                             f"then ends)")
        coordinate_mode = coordinate_mode or self.coordinate_transformation_mode
        plans = []
        for i, (axis, (scale, out)) in enumerate(zip(axes, self.output_size(shape, axes, scales,
                                                                           sizes))):
            axis_roi = None if roi is None else (roi[i], roi[len(axes) + i])
            if is_identity(shape[axis], out, scale, axis_roi):
                continue
            plans.append(axis_plan(
                axis, shape[axis], out, scale, mode=self.mode, coordinate_mode=coordinate_mode,
                nearest_mode=nearest_mode or self.nearest_mode, cubic_coeff_a=self.cubic_coeff_a,
                exclude_outside=self.exclude_outside, antialias=self.antialias,
                roi=axis_roi if coordinate_mode == "tf_crop_and_resize" else None))
        return plans

    def forward(self, ctx, x, roi=None, scales=None, sizes=None):
        if self.antialias and self.mode == "nearest":
            raise ValueError("Resize: antialias applies to linear and cubic modes, not nearest")
        plans = self.plans(x.shape, roi, scales, sizes)
        ctx.save(plans=plans)
        return resample(x, plans, self.extrapolation_value)

    def backward(self, ctx, dy):
        dx = resample_backward(dy, ctx.plans) if ctx.needs(0) and dy is not None else None
        return (dx, None, None, None)


@register("Resize", since=11)
class Resize11(Resize):
    """Opsets 11-17: no axes, antialias or keep_aspect_ratio_policy."""

    attributes = {k: v for k, v in Resize.attributes.items()
                  if k not in ("antialias", "axes", "keep_aspect_ratio_policy")}
    antialias, axes, keep_aspect_ratio_policy = 0, None, "stretch"


@register("Resize", since=10)
class Resize10(Resize11):
    """Opset 10: inputs X and scales, ``mode`` only; coordinates are asymmetric and nearest
    truncates when enlarging, rounds up when shrinking (as onnxruntime, and Upsample)."""

    attributes = {"mode": "nearest"}
    coordinate_transformation_mode, nearest_mode = "asymmetric", "simple"
    cubic_coeff_a, exclude_outside, extrapolation_value = -0.75, 0, 0.0
    no_grad_inputs = (1,)

    def forward(self, ctx, x, scales=None):
        return super().forward(ctx, x, None, scales, None)

    def backward(self, ctx, dy):
        return super().backward(ctx, dy)[:2]
