"""N-D sliding windows shared by Conv, ConvTranspose, MaxPool and AveragePool.

One geometry (``Window``) covers every rank: kernel, strides, dilations, the resolved begin/end
pads (explicit, or from ``auto_pad``) and, in ``ceil_mode``, the extra end padding the last
partial window reads. ``windows`` is a strided view ``(*lead, *kernel, *out)`` of a padded
array (im2col without a copy; kernel-major, so a reshape gives the GEMM operand); ``col2im``
adds such a tensor back onto the padded input, with one vectorised add per kernel offset (a
handful), never a loop over batch or pixels.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """Where each output position of a sliding-window op reads its input (spatial dims only)."""

    in_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out_shape: tuple[int, ...]
    extra_end: tuple[int, ...]  # ceil_mode: room the last window needs beyond pads_end

    @property
    def padded_shape(self) -> tuple[int, ...]:
        return tuple(i + b + e + x for i, b, e, x in
                     zip(self.in_shape, self.pads_begin, self.pads_end, self.extra_end))

    @property
    def size(self) -> int:
        return math.prod(self.kernel)

    def offsets(self) -> list[tuple[slice, ...]]:
        """Per kernel position (row-major), the slice of the padded input it reads for every
        output position."""
        return [tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in
                      zip(pos, self.dilations, self.strides, self.out_shape))
                for pos in itertools.product(*(range(k) for k in self.kernel))]


def _per_dim(op: str, name: str, value: Sequence[int] | None, rank: int, default: int,
             length: int | None = None) -> tuple[int, ...]:
    if value is None or len(value) == 0:
        return (default,) * (length or rank)
    value = tuple(int(v) for v in value)
    if len(value) != (length or rank):
        raise ValueError(f"{op}: {name} {list(value)} has {len(value)} values, expected "
                         f"{length or rank} for {rank} spatial dimension(s)")
    return value


def geometry(op: str, in_shape: Sequence[int], kernel: Sequence[int],
             strides: Sequence[int] | None = None, dilations: Sequence[int] | None = None,
             pads: Sequence[int] | None = None, auto_pad: str = "NOTSET",
             ceil_mode: int = 0) -> Window:
    """Resolve ONNX window attributes for an input of spatial shape ``in_shape``.

    ``pads`` is ONNX's ``[x1_begin, x2_begin, ..., x1_end, x2_end, ...]``. SAME_* pads so that
    ``out = ceil(in / stride)``, the odd pad at the end (UPPER) or the beginning (LOWER);
    ``ceil_mode`` rounds the output size up, dropping a last window that would start in the end
    padding (as onnx.reference and PyTorch do).

    >>> geometry("MaxPool", (5, 5), (2, 2), (2, 2), ceil_mode=1).out_shape
    (3, 3)
    """
    rank = len(in_shape)
    in_shape, kernel = tuple(int(i) for i in in_shape), tuple(int(k) for k in kernel)
    if len(kernel) != rank:
        raise ValueError(f"{op}: kernel {list(kernel)} has {len(kernel)} dimensions, the input "
                         f"has {rank} spatial dimension(s) {list(in_shape)}")
    strides = _per_dim(op, "strides", strides, rank, 1)
    dilations = _per_dim(op, "dilations", dilations, rank, 1)
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else (auto_pad or "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise ValueError(f"{op}: auto_pad must be one of {', '.join(AUTO_PADS)}, "
                         f"got {auto_pad!r}")
    extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (-(-i // s) - 1) * s + e - i) for i, s, e in zip(in_shape, strides, extent)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        begin, end = (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    elif auto_pad == "VALID":
        begin = end = [0] * rank
    else:
        both = _per_dim(op, "pads", pads, rank, 0, 2 * rank)
        begin, end = list(both[:rank]), list(both[rank:])
    out, extra = [], []
    for i, b, e, k, s in zip(in_shape, begin, end, extent, strides):
        span = i + b + e - k
        if span < 0:
            raise ValueError(f"{op}: window of extent {list(extent)} does not fit the padded "
                             f"input {list(in_shape)} (pads {begin + end})")
        n = -(-span // s) + 1 if ceil_mode else span // s + 1
        if ceil_mode and (n - 1) * s >= i + b:
            n -= 1  # the last window would start in the end padding
        out.append(n)
        extra.append(max(0, (n - 1) * s + k - (i + b + e)))
    return Window(in_shape, kernel, strides, dilations, tuple(begin), tuple(end), tuple(out),
                  tuple(extra))


def pad(x: np.ndarray, win: Window, value: float = 0.0) -> np.ndarray:
    """``x`` (*lead, *in_shape) padded to (*lead, *win.padded_shape) with ``value``."""
    widths = [(b, e + x_) for b, e, x_ in zip(win.pads_begin, win.pads_end, win.extra_end)]
    if not any(b or e for b, e in widths):
        return x
    lead = [(0, 0)] * (x.ndim - len(widths))
    return np.pad(x, lead + widths, mode="constant", constant_values=value)


def unpad(xp: np.ndarray, win: Window) -> np.ndarray:
    """The inverse of ``pad``: the input region of a padded array."""
    region = tuple(slice(b, b + i) for b, i in zip(win.pads_begin, win.in_shape))
    return xp[(..., *region)]


def windows(xp: np.ndarray, win: Window) -> np.ndarray:
    """A read-only strided view (*lead, *kernel, *out) of the padded ``xp`` (*lead, *padded)."""
    rank = len(win.kernel)
    lead, spatial = xp.strides[:-rank], xp.strides[-rank:]
    shape = (*xp.shape[:-rank], *win.kernel, *win.out_shape)
    strides = (*lead, *(t * d for t, d in zip(spatial, win.dilations)),
               *(t * s for t, s in zip(spatial, win.strides)))
    return as_strided(xp, shape, strides, writeable=False)


def col2im(cols: np.ndarray, win: Window, dtype: np.dtype | None = None) -> np.ndarray:
    """Sum ``cols`` (*lead, *kernel, *out) back onto a zero padded input (*lead, *padded).

    The adjoint of ``windows``: where windows overlap their contributions add up.
    """
    rank = len(win.kernel)
    lead = cols.shape[:cols.ndim - 2 * rank]
    xp = np.zeros((*lead, *win.padded_shape), dtype=dtype or cols.dtype)
    lead_all = (slice(None),) * len(lead)
    for pos, where in zip(itertools.product(*(range(k) for k in win.kernel)), win.offsets()):
        xp[(..., *where)] += cols[(*lead_all, *pos)]
    return xp
