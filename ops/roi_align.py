"""RoiAlign (ONNX opsets 10, 16+): pool each region of interest of X (N, C, H, W) to
(output_height, output_width) by bilinear sampling.

rois (R, 4) are [x1, y1, x2, y2] in input coordinates scaled by ``spatial_scale`` (shifted
by half a pixel with ``coordinate_transformation_mode="half_pixel"``, the default from 16;
opset 10 and "output_half_pixel" do not shift and make each roi at least 1 x 1);
batch_indices (R) picks the image. Each bin averages (``mode="avg"``) or takes the largest
weighted corner of (``"max"``, as onnxruntime) ``sampling_ratio`` x ``sampling_ratio``
bilinear samples (0: ``ceil(roi size / output size)`` per axis); samples more than one pixel
outside read 0.

Backward w.r.t. X (the sampling weights scattered back; for max, through the chosen corner);
rois and batch_indices have none.
"""

from __future__ import annotations

import math

import numpy as np

from meta.lv0 import Operator, register


def _axis_samples(start: float, size: float, bins: int, grid: int, length: int):
    """For one axis: per (bin, sample) the low/high index and their weights (0 outside)."""
    step = size / bins
    pos = start + np.arange(bins)[:, None] * step + (np.arange(grid)[None, :] + 0.5) * step / grid
    outside = (pos < -1.0) | (pos > length)
    pos = np.maximum(pos, 0.0)
    low = np.floor(pos).astype(np.int64)
    at_end = low >= length - 1
    low = np.where(at_end, length - 1, low)
    high = np.where(at_end, length - 1, low + 1)
    pos = np.where(at_end, low, pos)
    frac = pos - low
    w_low, w_high = np.where(outside, 0.0, 1 - frac), np.where(outside, 0.0, frac)
    return low, high, w_low, w_high  # each (bins, grid)


@register("RoiAlign", since=16)
class RoiAlign(Operator):
    """ONNX RoiAlign-16: region of Interest (RoI) align operation described in the Mask R-CNN
    paper."""
    attributes = {"coordinate_transformation_mode": "half_pixel", "mode": "avg",
                  "output_height": 1, "output_width": 1, "sampling_ratio": 0,
                  "spatial_scale": 1.0}
    no_grad_inputs = (1, 2)

    def plan(self, roi, height, width):
        half = self.coordinate_transformation_mode == "half_pixel"
        if not half and self.coordinate_transformation_mode != "output_half_pixel":
            raise ValueError(f"RoiAlign: unknown coordinate_transformation_mode "
                             f"{self.coordinate_transformation_mode!r}")
        offset = 0.5 if half else 0.0
        x1, y1, x2, y2 = (float(v) * self.spatial_scale - offset for v in roi)
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        oh, ow = self.output_height, self.output_width
        gh = self.sampling_ratio if self.sampling_ratio > 0 else math.ceil(rh / oh)
        gw = self.sampling_ratio if self.sampling_ratio > 0 else math.ceil(rw / ow)
        return (_axis_samples(y1, rh, oh, gh, height), _axis_samples(x1, rw, ow, gw, width),
                max(gh * gw, 1))

    def corners(self, ys, xs):
        """The four corners' (y index, x index, weight), each (oh, gh, ow, gw)."""
        (yl, yh, wyl, wyh), (xl, xh, wxl, wxh) = ys, xs
        grid = (slice(None), slice(None), None, None), (None, None, slice(None), slice(None))
        out = []
        for y, wy in ((yl, wyl), (yh, wyh)):
            for x, wx in ((xl, wxl), (xh, wxh)):
                out.append((np.broadcast_to(y[grid[0]], y.shape + x.shape),
                            np.broadcast_to(x[grid[1]], y.shape + x.shape),
                            wy[grid[0]] * wx[grid[1]]))
        return out

    def forward(self, ctx, x, rois, batch_indices):
        if self.mode not in ("avg", "max"):
            raise ValueError(f"RoiAlign: unknown mode {self.mode!r}")
        n_rois, channels = rois.shape[0], x.shape[1]
        h, w = x.shape[2:]
        y = np.zeros((n_rois, channels, self.output_height, self.output_width), x.dtype)
        plans = []
        for r in range(n_rois):
            image = x[int(batch_indices[r])]
            ys, xs, count = self.plan(rois[r], h, w)
            corners = self.corners(ys, xs)
            values = np.stack([image[:, yi, xi] * wt for yi, xi, wt in corners])  # (4, C, ...)
            if self.mode == "avg":
                y[r] = values.sum(axis=0).sum(axis=(2, 4)) / count
                plans.append((corners, count, None))
            else:
                flat = values.transpose(1, 2, 4, 0, 3, 5).reshape(
                    channels, self.output_height, self.output_width, -1)
                choice = flat.argmax(axis=-1)
                y[r] = np.take_along_axis(flat, choice[..., None], -1)[..., 0]
                plans.append((corners, count, choice))
        ctx.save(plans=plans, batch_indices=batch_indices, x_shape=x.shape)
        return y

    def backward(self, ctx, dy):
        dx = np.zeros(ctx.x_shape, dy.dtype)
        channels = ctx.x_shape[1]
        for r, (corners, count, choice) in enumerate(ctx.plans):
            target = dx[int(ctx.batch_indices[r])]
            if choice is None:
                g = dy[r] / count  # (C, oh, ow)
                for yi, xi, wt in corners:
                    contrib = g[:, :, None, :, None] * wt  # (C, oh, gh, ow, gw)
                    np.add.at(target, (slice(None), yi, xi), contrib)
                continue
            oh, gh, ow, gw = corners[0][2].shape
            # the chosen (corner, sample) of each output: index into (4, gh, gw)
            k, rest = np.divmod(choice, gh * gw)
            iy, ix = np.divmod(rest, gw)
            ph = np.arange(oh)[None, :, None]
            pw = np.arange(ow)[None, None, :]
            for c in range(4):
                yi, xi, wt = corners[c]
                pick = k == c
                rows, cols = yi[ph, iy, pw, ix], xi[ph, iy, pw, ix]
                weight = wt[ph, iy, pw, ix]
                chan = np.broadcast_to(np.arange(channels)[:, None, None], pick.shape)
                np.add.at(target, (chan[pick], rows[pick], cols[pick]),
                          (dy[r] * weight)[pick])
        return (dx, None, None)


@register("RoiAlign", since=10)
class RoiAlign10(RoiAlign):
    """Opset 10: no coordinate_transformation_mode (rois are not shifted by half a pixel)."""

    attributes = {k: v for k, v in RoiAlign.attributes.items()
                  if k != "coordinate_transformation_mode"}
    coordinate_transformation_mode = "output_half_pixel"
