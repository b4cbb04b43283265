"""Test cases for Resize and Upsample (see cases.py for the format)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .cases_nn import OracleLimit


def _f32(*values):
    return np.array(values, np.float32)


def _i64(*values):
    return np.array(values, np.int64)


def resize(rng):
    x = rng.standard_normal((1, 2, 4, 5))
    x3 = rng.standard_normal((2, 3, 4))
    new, mid = range(18, 100), range(11, 18)
    # onnx.reference computes cubic coefficients (and roi-based coordinates) in float32 (NEP 50:
    # a float32 attribute times a Python float stays float32): tests/lv0/test_resample.py
    # compares those cases with it at float32 tolerance.
    f32 = "onnx.reference computes this mode's weights in float32"

    def ref32(attrs):
        return OracleLimit(attrs, 0, f32)

    cases = [
        ({}, [x, None, _f32(1, 1, 2, 1.5)], new),  # nearest, half_pixel
        ({"mode": "linear"}, [x, None, _f32(1, 1, 0.6, 0.8)], new),
        ({"mode": "linear", "coordinate_transformation_mode": "align_corners"},
         [x, None, None, _i64(1, 2, 7, 3)], new),
        ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
         [x, None, None, _i64(1, 2, 1, 8)], new),
        (ref32({"mode": "cubic"}), [x, None, _f32(1, 1, 1.5, 0.6)], new),
        (ref32({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1,
          "coordinate_transformation_mode": "asymmetric"}), [x, None, _f32(1, 1, 2, 0.8)], new),
        ({"mode": "linear", "antialias": 1}, [x, None, _f32(1, 1, 0.5, 0.6)], new),
        (ref32({"mode": "cubic", "antialias": 1}), [x, None, None, _i64(1, 2, 3, 2)], new),
        ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
         [x, None, _f32(1, 1, 1.7, 0.7)], new),
        (ref32({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
          "extrapolation_value": 2.5, "axes": [2, 3]}),
         [x, _f32(0.2, -0.3, 1.1, 0.9), None, _i64(5, 4)], new),
        ({"axes": [3, 2], "keep_aspect_ratio_policy": "not_larger"},
         [x, None, None, _i64(8, 9)], new),
        ({"axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller", "mode": "linear"},
         [x, None, None, _i64(3, 3)], new),
        ({"nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"},
         [x3, None, _f32(1, 1.5, 2.5)], new),
        ({"nearest_mode": "floor"}, [x3, None, _f32(1, 0.7, 1.3)], new),
        ({"nearest_mode": "ceil", "coordinate_transformation_mode": "align_corners"},
         [x3, None, None, _i64(2, 5, 3)], new),
        ({"mode": "linear"}, [rng.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8), None,
                              _f32(1, 1, 2, 1.5)], new),
        ({}, [np.zeros((0, 2, 3)), None, _f32(1, 2, 2)], new),
        # opsets 11-17: roi and scales required (an empty scales when sizes are given)
        ({"mode": "linear"}, [x, _f32(), _f32(1, 1, 0.6, 1.4)], mid),
        (ref32({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}),
         [x, _f32(), _f32(), _i64(1, 2, 3, 7)], mid),
        (OracleLimit({"coordinate_transformation_mode": "tf_half_pixel_for_nn"}, 0,
                     "onnx.reference does not know tf_half_pixel_for_nn"),
         [x3, _f32(), _f32(1, 2, 0.5)], mid),
        (ref32({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"}),
         [x3, _f32(0, 0.1, 0.2, 1, 0.9, 1.2), _f32(), _i64(2, 3, 5)], mid),
    ]
    # Opset 10 (X, scales; asymmetric, truncating nearest): onnx.reference cannot run it, so
    # tests/lv0/test_resample.py compares it with Upsample's formula.
    old = "onnx.reference's Resize needs coordinate_transformation_mode, absent at opset 10"
    cases += [(OracleLimit({}, 0, old), [x, _f32(1, 1, 2, 1.5)], range(10, 11)),
              (OracleLimit({"mode": "linear"}, 0, old), [x, _f32(1, 1, 0.5, 2)], range(10, 11))]
    return cases


def upsample(rng):
    x = rng.standard_normal((1, 2, 3, 2))
    limit = "onnx.reference's Upsample knows only nearest with integer scales, at opset 9"
    return [({}, [x, _f32(1, 1, 2, 3)], range(9, 100)),
            (OracleLimit({"mode": "linear"}, 0, limit), [x, _f32(1, 1, 2, 1.5)], range(9, 100)),
            (OracleLimit({"scales": [1.0, 1.0, 2.0, 2.0]}, 0, limit), [x], range(7, 9)),
            (OracleLimit({"scales": [1.0, 2.0, 1.5, 1.0], "mode": "linear"}, 0, limit), [x],
             range(7, 9))]


GRID_F32 = "onnx.reference computes GridSample coordinates in float32"


def grid_sample(rng):
    """onnx.reference keeps coordinates in float32: tests/lv0/test_resample.py compares with
    it at float32 tolerance."""
    x = rng.standard_normal((2, 2, 3, 4))
    grid = rng.uniform(-1.3, 1.3, (2, 3, 2, 2))
    x3, grid3 = rng.standard_normal((1, 2, 3, 2, 4)), rng.uniform(-1.2, 1.2, (1, 2, 2, 3, 3))
    cases = []
    for mode in ("linear", "nearest", "cubic"):
        for padding in ("zeros", "border", "reflection"):
            for align in (0, 1):
                attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
                cases.append((OracleLimit(attrs, 0, GRID_F32), [x, grid], range(20, 100)))
    cases += [(OracleLimit({"mode": "linear", "padding_mode": p}, 0, GRID_F32), [x3, grid3],
               range(20, 100)) for p in ("zeros", "reflection")]
    cases += [(OracleLimit({"mode": m}, 0, GRID_F32), [x, grid], range(16, 20))
              for m in ("bilinear", "bicubic", "nearest")]
    return cases


def col2im(rng):
    image, block = np.array([4, 5], np.int64), np.array([2, 2], np.int64)
    return [({}, [rng.standard_normal((1, 2 * 4, 12)), image, block]),
            ({"strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [1, 2]},
             [rng.standard_normal((2, 4, 12)), image, block]),
            ({}, [rng.standard_normal((1, 3, 4)), np.array([6], np.int64),
                  np.array([3], np.int64)])]


def dft(rng):
    real, cplx = rng.standard_normal((2, 8, 1)), rng.standard_normal((2, 7, 2))
    new, old = range(20, 100), range(17, 20)
    i64 = np.int64
    return [({}, [real], new), ({}, [cplx], new), ({"onesided": 1}, [real], new),
            ({}, [real, np.array(10, i64)], new),  # zero-padded
            ({"onesided": 1}, [cplx, np.array(5, i64)], new),  # truncated
            ({"inverse": 1}, [cplx], new),
            ({"inverse": 1, "onesided": 1}, [rng.standard_normal((2, 5, 2))], new),
            ({"inverse": 1, "onesided": 1}, [rng.standard_normal((2, 5, 2)), np.array(9, i64)],
             new),
            ({}, [rng.standard_normal((4, 3, 2)), None, np.array(0, i64)], new),
            ({"axis": 1}, [real], old), ({"axis": 0, "inverse": 1}, [cplx], old)]


def stft(rng):
    real, cplx = rng.standard_normal((2, 16, 1)), rng.standard_normal((1, 12, 2))
    window = rng.uniform(0.5, 1, 6)
    i64 = np.int64
    return [({}, [real, np.array(4, i64), window]),
            ({"onesided": 0}, [real, np.array(3, i64), window, np.array(6, i64)]),
            ({"onesided": 0}, [cplx, np.array(2, i64), None, np.array(5, i64)]),
            ({}, [real, np.array(5, i64), None, np.array(8, i64)])]


def roi_align(rng):
    x = rng.standard_normal((2, 2, 6, 5))
    rois = np.array([[0.5, 1.0, 4.0, 5.5], [-1.5, 0.2, 2.0, 2.5], [1.0, 1.0, 1.6, 1.4],
                     [2.0, 3.0, 9.0, 8.0]])
    batch = np.array([0, 1, 1, 0], np.int64)
    new, old = range(16, 100), range(10, 16)
    return [({"output_height": 2, "output_width": 3}, [x, rois, batch], new),
            ({"output_height": 3, "output_width": 2, "sampling_ratio": 2,
              "spatial_scale": 0.5}, [x, rois, batch], new),
            ({"coordinate_transformation_mode": "output_half_pixel", "output_height": 2,
              "output_width": 2}, [x, rois, batch], new),
            ({"mode": "max", "output_height": 2, "output_width": 2, "sampling_ratio": 2},
             [x, rois, batch], new),
            # opset 10 does not shift rois by half a pixel (16's "output_half_pixel", as
            # onnxruntime); onnx.reference applies 16's default half_pixel to it
            (OracleLimit({"output_height": 2, "output_width": 2}, 0,
                         "onnx.reference shifts opset-10 rois by half a pixel"),
             [x, rois, batch], old)]


CASES: dict[str, Callable[[np.random.Generator], list]] = {
    "DFT": dft,
    "RoiAlign": roi_align,
    "STFT": stft,
    "Resize": resize,
    "Upsample": upsample,
    "GridSample": grid_sample,
    "Col2Im": col2im,
}
