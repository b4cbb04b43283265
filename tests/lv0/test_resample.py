"""Resize and Upsample where the registry-driven tests cannot use onnx.reference at full
precision: its cubic weights and roi coordinates are float32 (compared here at float32
tolerance), it lacks opset-10 Resize, tf_half_pixel_for_nn, Upsample-7 and linear Upsample
(compared with formulas)."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import Context
from meta.ops.resize import Resize, Resize10, Resize11
from meta.ops.upsample import Upsample, Upsample7

from .cases import cases_for
from .test_ops import _oracle


@pytest.mark.parametrize("cls,opset", [(Resize, 21), (Resize11, 17)])
def test_float32_weight_cases_match_onnx_reference_to_float32(cls, opset):
    checked = 0
    for attrs, inputs in cases_for("Resize", seed=1, opset=opset):
        if "float32" not in getattr(attrs, "reason", ""):
            continue
        (ours,) = cls(**attrs).apply(Context(), *inputs)
        (theirs,) = _oracle("Resize", dict(attrs), inputs, opset, 1)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=str(attrs))
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("opset", [16, 21])
def test_grid_sample_matches_onnx_reference_to_float32(opset):
    from meta.ops.grid_sample import GridSample, GridSample16

    cls = GridSample if opset >= 20 else GridSample16
    cases = cases_for("GridSample", seed=1, opset=opset)
    assert cases
    for attrs, inputs in cases:
        x, grid = (v.astype(np.float32) for v in inputs)
        (ours,) = cls(**attrs).apply(Context(), x, grid)
        # onnx.reference knows the opset-20 mode names only
        named = {**attrs, "mode": {"bilinear": "linear", "bicubic": "cubic"}.get(
            attrs["mode"], attrs["mode"])}
        (theirs,) = _oracle("GridSample", named, [x, grid], opset, 1)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5, err_msg=str(attrs))


def test_opset_10_resize_is_upsample():
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4))
    for mode in ("nearest", "linear"):
        scales = np.array([1, 1, 2, 1.5], np.float32)
        np.testing.assert_array_equal(Resize10(mode=mode).apply(Context(), x, scales)[0],
                                      Upsample(mode=mode).apply(Context(), x, scales)[0])
        np.testing.assert_array_equal(
            Upsample7(mode=mode, scales=[1.0, 1.0, 2.0, 1.5]).apply(Context(), x)[0],
            Upsample(mode=mode).apply(Context(), x, scales)[0])
    # nearest truncates enlarging, rounds up shrinking: 5 -> 2 picks ceil(0 / 0.5), ceil(1 / 0.5)
    y = Resize10().apply(Context(), np.arange(5.0), np.array([0.5], np.float32))[0]
    np.testing.assert_array_equal(y, [0.0, 2.0])
    y = Resize10().apply(Context(), np.arange(3.0), np.array([2.5], np.float32))[0]
    np.testing.assert_array_equal(y, [0, 0, 0, 1, 1, 2, 2])  # floor(i / 2.5)


def test_linear_upsample_is_asymmetric_bilinear():
    x = np.array([[1.0, 2.0], [3.0, 5.0]])
    (y,) = Upsample(mode="linear").apply(Context(), x, np.array([2, 2], np.float32))
    np.testing.assert_allclose(y, [[1, 1.5, 2, 2], [2, 2.75, 3.5, 3.5], [3, 4, 5, 5],
                                   [3, 4, 5, 5]])
    with pytest.raises(ValueError, match=">= 1"):
        Upsample().apply(Context(), x, np.array([1, 0.5], np.float32))


def test_tf_half_pixel_for_nn():
    x = np.arange(6.0)
    (y,) = Resize11(coordinate_transformation_mode="tf_half_pixel_for_nn").apply(
        Context(), x, np.zeros(0, np.float32), np.array([0.5], np.float32))
    # (i + 0.5) / 0.5 = 1, 3, 5, rounded half down
    np.testing.assert_array_equal(y, [1.0, 3.0, 5.0])


def test_integer_and_empty_inputs():
    x = np.array([[0, 100], [200, 255]], np.uint8)
    (y,) = Resize(mode="linear").apply(Context(), x, None, np.array([1, 2], np.float32))
    assert y.dtype == np.uint8
    np.testing.assert_array_equal(y, [[0, 25, 75, 100], [200, 214, 241, 255]])
    (y,) = Resize().apply(Context(), np.zeros((0, 3)), None, None, np.array([0, 6]))
    assert y.shape == (0, 6)


def test_opset_10_roi_align_is_output_half_pixel():
    from meta.ops.roi_align import RoiAlign, RoiAlign10

    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5))
    rois, batch = np.array([[0.5, 1.0, 3.0, 4.5]]), np.array([0])
    attrs = {"output_height": 2, "output_width": 2}
    (old,) = RoiAlign10(**attrs).apply(Context(), x, rois, batch)
    (new,) = RoiAlign(coordinate_transformation_mode="output_half_pixel", **attrs).apply(
        Context(), x, rois, batch)
    np.testing.assert_array_equal(old, new)
