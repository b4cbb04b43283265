"""Pad: grow (or, with negative pads, crop) a tensor on each side of each axis.

``pads`` lists all begins then all ends, one pair per padded axis. Versions: attributes
``pads``/``value`` (opsets 2-10); int64 ``pads`` input and optional ``constant_value`` input
(11+); optional ``axes`` input naming the padded axes (18+); ``wrap`` mode (19+). Modes map
onto numpy.pad: constant, reflect (mirror without repeating the edge), edge, wrap.
"""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register

from ._axes import as_ints, normalize_axis


@register("Pad", since=19)
class Pad(Operator):
    """ONNX Pad-19: given a tensor containing the data to be padded (data), a tensor containing
    the number of start and end pad values for axis (pads), (optionally) a mode, and
    (optionally) constant_value, a padded ..."""
    attributes = {"mode": "constant"}
    modes = ("constant", "reflect", "edge", "wrap")

    def forward(self, ctx, x, pads, constant_value=None, axes=None):
        if self.mode not in self.modes:
            raise ValueError(f"Pad: unknown mode {self.mode!r} (opset {self.since}+ knows "
                             f"{', '.join(self.modes)})")
        pads = as_ints(pads)
        axes = list(range(x.ndim)) if axes is None else \
            [normalize_axis(a, x.ndim, self.op_type) for a in as_ints(axes)]
        if len(set(axes)) != len(axes) or len(pads) != 2 * len(axes):
            raise ValueError(f"Pad: pads {pads} must hold a begin and an end for each of the "
                             f"distinct axes {axes} (input shape {x.shape})")
        width = [(0, 0)] * x.ndim
        for i, axis in enumerate(axes):
            width[axis] = (pads[i], pads[len(axes) + i])
        # Negative pads crop first; the rest is padding proper.
        crop = tuple(slice(max(-b, 0), n - max(-e, 0)) for (b, e), n in zip(width, x.shape))
        grow = [(max(b, 0), max(e, 0)) for b, e in width]
        inner = x[crop]
        if self.mode == "constant":
            value = 0 if constant_value is None else np.asarray(constant_value).reshape(-1)[0]
            y = np.pad(inner, grow, mode="constant", constant_values=value)
        else:
            if inner.size == 0 and any(b or e for b, e in grow):
                raise ValueError(f"Pad: cannot pad an empty tensor of shape {inner.shape} in "
                                 f"{self.mode!r} mode")
            y = np.pad(inner, grow, mode=self.mode)
        value_shape = None if constant_value is None else np.shape(constant_value)
        ctx.save(crop=crop, grow=grow, shape=x.shape, inner_shape=inner.shape,
                 value_shape=value_shape)
        return y

    def backward(self, ctx, dy):
        if dy is None:
            return (None,) * 4
        if self.mode == "constant":
            d_inner = dy[tuple(slice(b, b + n) for (b, _), n in zip(ctx.grow, ctx.inner_shape))]
        else:
            # Which input element each output element copies: pad an index map the same way,
            # then add every output gradient into its source (elements are copied many times).
            size = int(np.prod(ctx.inner_shape))
            source = np.pad(np.arange(size).reshape(ctx.inner_shape), ctx.grow, mode=self.mode)
            d_inner = np.bincount(source.reshape(-1), weights=dy.reshape(-1), minlength=size)
            d_inner = d_inner.astype(dy.dtype, copy=False).reshape(ctx.inner_shape)
        dx = np.zeros(ctx.shape, dy.dtype)
        dx[ctx.crop] = d_inner
        dvalue = None
        if ctx.value_shape is not None:
            # The padding value fills every output element that is not copied from the input.
            total = dy.sum() - d_inner.sum() if self.mode == "constant" else 0
            dvalue = np.full(ctx.value_shape, total, dtype=dy.dtype)
        return (dx, None, dvalue, None)


@register("Pad", since=18)
class Pad18(Pad):
    """ONNX Pad-18: given a tensor containing the data to be padded (data), a tensor containing
    the number of start and end pad values for axis (pads), (optionally) a mode, and
    (optionally) constant_value, a padded ..."""
    modes = ("constant", "reflect", "edge")


@register("Pad", since=11)
class Pad11(Pad18):
    """ONNX Pad-11: given a tensor containing the data to be padded (data), a tensor containing
    the number of start and end pad values for axis (pads), (optionally) a mode, and
    (optionally) constant_value, a padded ..."""
    def forward(self, ctx, x, pads, constant_value=None):
        return super().forward(ctx, x, pads, constant_value)


@register("Pad", since=2)
class Pad2(Pad18):
    """ONNX Pad-2: given data tensor, pads, mode, and value."""
    attributes = {"mode": "constant", "pads": None, "value": 0.0}

    def forward(self, ctx, x):
        if self.pads is None:
            raise ValueError("Pad: the pads attribute is required")
        return super().forward(ctx, x, self.pads, np.asarray(self.value, x.dtype))

    def backward(self, ctx, dy):
        return super().backward(ctx, dy)[:1]
