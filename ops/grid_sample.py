"""GridSample (ONNX opsets 16, 20+): sample X (N, C, *S) at the normalised coordinates of
``grid`` (N, *out, K), K = len(S), last axis (x, y[, z]) from the fastest input axis.

Coordinates map [-1, 1] to the corner pixels' centres (``align_corners=1``) or their outer
edges; ``mode`` nearest (round half to even), linear (N-linear) or cubic (Keys, a = -0.75;
opset 16 says bilinear / bicubic and allows 2-D only); ``padding_mode`` zeros (samples
outside read 0), border (coordinates clamped) or reflection (coordinates reflected at the
border, repeatedly). Every output is a weighted sum over a product of per-axis taps.

Backward: w.r.t. X, the weights scattered back; w.r.t. the grid (linear and cubic), the
derivative of the weights along each axis times the coordinate map's slope (zero where the
border clamps). onnx.reference keeps coordinates in float32; meta computes them in the
grid's type.
"""

from __future__ import annotations

import itertools

import numpy as np

from meta.lv0 import Operator, register

CUBIC_A = -0.75


def _cubic(t):
    """The four Keys weights for a fraction t, and their derivatives in t."""
    a = CUBIC_A
    u = [t + 1, t, 1 - t, 2 - t]
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a  # noqa: E731  1 <= s <= 2
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1  # noqa: E731  s <= 1
    dfar = lambda s: (3 * a * s - 10 * a) * s + 8 * a  # noqa: E731
    dnear = lambda s: (3 * (a + 2) * s - 2 * (a + 3)) * s  # noqa: E731
    w = [far(u[0]), near(u[1]), near(u[2]), far(u[3])]
    dw = [dfar(u[0]), dnear(u[1]), -dnear(u[2]), -dfar(u[3])]
    return np.stack(w, -1), np.stack(dw, -1)


def _reflect(x, low, high):
    """x reflected into [low, high] (as often as needed), and d(result)/dx (+1 or -1)."""
    span = high - low
    if span <= 0:
        return np.full_like(x, low), np.zeros_like(x)
    d = np.where(x < low, low - x, x - high)
    n = np.floor(d / span)
    r = d - n * span
    below, above = x < low, x > high
    even = n % 2 == 0
    out = np.where(below, np.where(even, low + r, high - r),
                   np.where(above, np.where(even, high - r, low + r), x))
    slope = np.where(below, np.where(even, -1.0, 1.0),
                     np.where(above, np.where(even, -1.0, 1.0), 1.0))
    return out, slope


@register("GridSample", since=20)
class GridSample(Operator):
    """ONNX GridSample-20: given an input X and a flow-field grid, computes the output Y using X
    values and pixel locations from the grid."""
    attributes = {"align_corners": 0, "mode": "linear", "padding_mode": "zeros"}
    no_grad_inputs = ()

    def axis_taps(self, g, length):
        """For one axis: tap indices (P, T), weights (P, T), d weights / d g (P, T) and
        whether each tap reads inside (P, T)."""
        align = bool(self.align_corners)
        if align:
            x, slope = (g + 1) / 2 * (length - 1), (length - 1) / 2
        else:
            x, slope = ((g + 1) * length - 1) / 2, length / 2
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(self.mode, self.mode)
        if mode == "nearest":
            x = np.rint(x)
        low, high = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
        dx = np.full_like(x, slope)
        if self.padding_mode == "border":
            outside = (x < low) | (x > high)
            clamped = np.clip(x, 0, length - 1)
            dx = np.where(outside, 0.0, dx)
            x = np.where(outside, clamped, x)
        elif self.padding_mode == "reflection":
            x, sign = _reflect(x, low, high)
            dx = dx * sign
        elif self.padding_mode != "zeros":
            raise ValueError(f"GridSample: unknown padding_mode {self.padding_mode!r}")
        if mode == "nearest":
            index = x.astype(np.int64)[:, None]
            w, dw = np.ones_like(x)[:, None], np.zeros_like(x)[:, None]
        elif mode == "linear":
            base = np.floor(x)
            t = x - base
            index = base.astype(np.int64)[:, None] + np.arange(2)
            w, dw = np.stack([1 - t, t], -1), np.stack([-np.ones_like(t), np.ones_like(t)], -1)
        elif mode == "cubic":
            base = np.floor(x)
            index = base.astype(np.int64)[:, None] + np.arange(-1, 3)
            w, dw = _cubic(x - base)
        else:
            raise ValueError(f"GridSample: unknown mode {self.mode!r}")
        inside = (index >= 0) & (index < length)
        if self.padding_mode == "border":
            index = np.clip(index, 0, length - 1)
        elif self.padding_mode == "reflection":
            index = _reflect(index.astype(x.dtype), low, high)[0].astype(np.int64)
            index = np.clip(index, 0, length - 1)
        inside = inside | (self.padding_mode != "zeros")
        return np.clip(index, 0, length - 1), w, dw * dx[:, None], inside

    def plan(self, x, grid):
        n, spatial = x.shape[0], x.shape[2:]
        k = len(spatial)
        if grid.shape[0] != n or grid.shape[-1] != k:
            raise ValueError(f"GridSample: grid {list(grid.shape)} must be (N={n}, *out, "
                             f"{k}) for X {list(x.shape)}")
        points = grid.reshape(n, -1, k)
        p = points.shape[1]
        batch = np.repeat(np.arange(n), p)
        taps = [self.axis_taps(points[..., k - 1 - d].reshape(-1), spatial[d]) for d in range(k)]
        return batch, taps

    def combos(self, taps):
        """Every combination of one tap per axis: (indices, weight, inside, per-axis parts)."""
        for choice in itertools.product(*(range(t[0].shape[1]) for t in taps)):
            index = tuple(t[0][:, c] for t, c in zip(taps, choice))
            weights = [t[1][:, c] for t, c in zip(taps, choice)]
            dweights = [t[2][:, c] for t, c in zip(taps, choice)]
            inside = np.logical_and.reduce([t[3][:, c] for t, c in zip(taps, choice)])
            yield index, weights, dweights, inside

    def forward(self, ctx, x, grid):
        batch, taps = self.plan(x, grid)
        out = np.zeros((batch.size, x.shape[1]), np.result_type(x.dtype, grid.dtype))
        for index, weights, _, inside in self.combos(taps):
            w = np.prod(weights, axis=0) * inside
            out += x[(batch, slice(None), *index)] * w[:, None]
        y = out.reshape(x.shape[0], -1, x.shape[1]).transpose(0, 2, 1)
        ctx.save(x=x, grid=grid, batch=batch, taps=taps)
        return np.ascontiguousarray(y.reshape(x.shape[0], x.shape[1],
                                              *grid.shape[1:-1])).astype(x.dtype, copy=False)

    def backward(self, ctx, dy):
        x, grid, batch, taps = ctx.x, ctx.grid, ctx.batch, ctx.taps
        g = dy.reshape(x.shape[0], x.shape[1], -1).transpose(0, 2, 1).reshape(-1, x.shape[1])
        dx = np.zeros_like(x) if ctx.needs(0) else None
        k = len(taps)
        dpoints = np.zeros((batch.size, k), g.dtype)
        for index, weights, dweights, inside in self.combos(taps):
            w = np.prod(weights, axis=0) * inside
            if dx is not None:
                np.add.at(dx, (batch, slice(None), *index), g * w[:, None])
            values = (x[(batch, slice(None), *index)] * g).sum(axis=1) * inside
            for d in range(k):
                others = np.prod([weights[e] for e in range(k) if e != d], axis=0) \
                    if k > 1 else 1.0
                dpoints[:, k - 1 - d] += values * others * dweights[d]
        dgrid = dpoints.reshape(grid.shape).astype(grid.dtype, copy=False)
        return (dx, dgrid if ctx.needs(1) else None)


@register("GridSample", since=16)
class GridSample16(GridSample):
    """Opset 16: modes are called bilinear / bicubic (the default bilinear), 2-D only."""

    attributes = {"align_corners": 0, "mode": "bilinear", "padding_mode": "zeros"}
