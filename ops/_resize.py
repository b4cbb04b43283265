"""Resampling maths shared by Resize and Upsample: one (out, in) weight matrix per resized axis.

Every mode ONNX defines (nearest, N-linear, N-cubic, with or without antialiasing) is separable:
the output is the input multiplied along each resized axis by a matrix whose row ``o`` holds
the weights of the input samples that output ``o`` reads. Forward applies the matrices one axis
after the other; backward applies their transposes in reverse order, so every mode has its
exact gradient with no mode-specific code. ``tf_crop_and_resize`` sets output rows whose source
coordinate falls outside the input to ``extrapolation_value`` after each axis (as onnx.reference
does); those rows get no gradient.

Coordinates follow onnx.reference, which wrote ONNX's test data: ``align_corners``,
``pytorch_half_pixel`` and ``tf_crop_and_resize`` use the unrounded output length
``scale * length_original`` when the output size came from ``scales`` (onnxruntime uses the
rounded one, and fails two of those cases).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AxisPlan:
    axis: int
    weights: np.ndarray  # (out, in), float64
    outside: np.ndarray | None  # (out,) bool: rows that take the extrapolation value


def source_coordinates(mode: str, out_len: int, in_len: int, scale: float,
                       roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """x_original for every output index along one axis, and the rows outside the input
    (``tf_crop_and_resize`` only)."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len  # the unrounded output length
    outside = None
    if mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        x = offset + (y + 0.5) / scale - 0.5
    elif mode == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "align_corners":
        x = np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    elif mode == "tf_crop_and_resize":
        start, end = roi if roi is not None else (0.0, 1.0)
        if width == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        else:
            x = y * (end - start) * (in_len - 1) / (width - 1)
        x = x + start * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {mode!r}")
    return x, outside


def nearest_index(x: np.ndarray, nearest_mode: str, scale: float) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if nearest_mode == "floor":
        return np.floor(x)
    if nearest_mode == "ceil":
        return np.ceil(x)
    if nearest_mode == "simple":  # opsets before 11: truncate when enlarging, ceil when shrinking
        return np.ceil(x) if scale < 1 else np.floor(x)
    raise ValueError(f"unknown nearest_mode {nearest_mode!r}")


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def axis_plan(axis: int, in_len: int, out_len: int, scale: float, *, mode: str,
              coordinate_mode: str, nearest_mode: str = "round_prefer_floor",
              cubic_coeff_a: float = -0.75, exclude_outside: int = 0, antialias: int = 0,
              roi: tuple[float, float] | None = None) -> AxisPlan:
    x, outside = source_coordinates(coordinate_mode, out_len, in_len, scale, roi)
    weights = np.zeros((out_len, in_len))
    rows = np.arange(out_len)
    if in_len == 0 or out_len == 0:
        return AxisPlan(axis, weights, outside)
    if mode == "nearest":
        index = np.clip(nearest_index(x, nearest_mode, scale), 0, in_len - 1).astype(np.intp)
        weights[rows, index] = 1.0
    else:
        # The samples around x: kernel((i - x) * s) for i in a window, the kernel stretched by
        # 1 / s when antialiasing a downscale. At an integer x the window starts one sample
        # earlier (ratio 1, as onnx.reference), which only matters with exclude_outside.
        s = min(scale, 1.0) if antialias else 1.0
        reach = 1 if mode == "linear" else 2
        if mode not in ("linear", "cubic"):
            raise ValueError(f"unknown mode {mode!r}")
        start = int(np.floor(-reach / s)) + 1
        taps = 2 - 2 * start
        base = np.floor(x)
        ratio = x - base
        whole = ratio == 0
        base, ratio = np.where(whole, base - 1, base), np.where(whole, 1.0, ratio)
        offsets = np.arange(start, start + taps)
        t = (offsets[None, :] - ratio[:, None]) * s
        coeffs = np.clip(1 - np.abs(t), 0, 1) if mode == "linear" else _cubic(t, cubic_coeff_a)
        if antialias:
            coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
        index = base[:, None].astype(np.intp) + offsets[None, :]
        if exclude_outside:
            coeffs = np.where((index < 0) | (index >= in_len), 0.0, coeffs)
            total = coeffs.sum(axis=1, keepdims=True)
            coeffs = coeffs / np.where(total == 0, 1.0, total)
        np.add.at(weights, (np.repeat(rows, taps), np.clip(index, 0, in_len - 1).ravel()),
                  coeffs.ravel())
    if outside is not None:
        weights[outside] = 0.0
    return AxisPlan(axis, weights, outside)


def is_identity(in_len: int, out_len: int, scale: float,
                roi: tuple[float, float] | None) -> bool:
    """An axis left as it is (onnx.reference skips it, so do we)."""
    return (out_len == in_len and bool(np.isclose(scale, 1.0))
            and (roi is None or (np.isclose(roi[0], 0.0) and np.isclose(roi[1], 1.0))))


def _along(weights: np.ndarray, x: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(np.tensordot(weights, x, axes=([1], [axis])), 0, axis)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(dtype) if dtype in (np.float32, np.float64) else np.dtype(np.float64)


def resample(x: np.ndarray, plans: list[AxisPlan], extrapolation_value: float = 0.0
             ) -> np.ndarray:
    """``x`` resampled along each plan's axis, in X's dtype (integers rounded and clipped)."""
    work = compute_dtype(x.dtype)
    y = x.astype(work, copy=False)
    for plan in plans:
        y = _along(plan.weights.astype(work, copy=False), y, plan.axis)
        if plan.outside is not None and plan.outside.any():
            shape = [1] * y.ndim
            shape[plan.axis] = -1
            y = np.where(plan.outside.reshape(shape), work.type(extrapolation_value), y)
    if x.dtype == work:
        return y
    if x.dtype == np.bool_:
        return y > 0.5
    if np.issubdtype(x.dtype, np.integer):
        info = np.iinfo(x.dtype)
        return np.clip(np.round(y), info.min, info.max).astype(x.dtype)
    return y.astype(x.dtype)


def resample_backward(dy: np.ndarray, plans: list[AxisPlan]) -> np.ndarray:
    """The gradient w.r.t. X: the transposed matrices in reverse order (extrapolated rows,
    constants, pass nothing back)."""
    work = compute_dtype(dy.dtype)
    g = dy.astype(work, copy=False)
    for plan in reversed(plans):
        if plan.outside is not None and plan.outside.any():
            shape = [1] * g.ndim
            shape[plan.axis] = -1
            g = np.where(plan.outside.reshape(shape), 0, g)
        g = _along(plan.weights.T.astype(work, copy=False), g, plan.axis)
    return g.astype(dy.dtype, copy=False)
