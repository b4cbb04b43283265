"""Shared by the quantization operators: scale and zero-point broadcasting (a scalar,
per-axis, or per-block along ``axis``) and integer saturation."""

from __future__ import annotations

import numpy as np

INTEGER_TYPES = (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32)


def broadcast_param(value: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int,
                    what: str) -> np.ndarray:
    """``value`` (scalar, (shape[axis],), or X's shape with ``ceil(n / block_size)`` along
    ``axis``) broadcastable to ``shape``."""
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(())
    axis = axis + len(shape) if axis < 0 else axis
    if not block_size:
        if value.ndim != 1 or value.size != shape[axis]:
            raise ValueError(f"{what} {list(value.shape)} must be a scalar or have "
                             f"{shape[axis]} values (axis {axis} of {list(shape)})")
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    full = np.repeat(value, block_size, axis=axis).take(range(shape[axis]), axis=axis)
    if full.shape != tuple(shape):
        raise ValueError(f"{what} {list(value.shape)} does not block {list(shape)} with "
                         f"block_size={block_size} along axis {axis}")
    return full


def saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round half to even, clip to ``dtype``'s range, cast."""
    info = np.iinfo(dtype)
    return np.clip(np.rint(values), info.min, info.max).astype(dtype)


def quantized_type(dtype, what: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.type not in INTEGER_TYPES:
        raise ValueError(f"{what}: {dtype} is not a quantized type meta supports (8- and "
                         f"16-bit integers; float8, int4 and int2 have no numpy dtype)")
    return dtype
