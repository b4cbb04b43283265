"""The index maths of DepthToSpace and SpaceToDepth: a reshape, a transpose, a reshape."""

from __future__ import annotations

import numpy as np


def depth_to_space(x: np.ndarray, b: int, mode: str, op: str = "DepthToSpace") -> np.ndarray:
    n, c, h, w = _check(x, op)
    if c % (b * b):
        raise ValueError(f"{op}: {c} channels are not a multiple of blocksize^2 = {b * b}")
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"{op}: mode must be 'DCR' or 'CRD', got {mode!r}")
    return t.reshape(n, c // (b * b), h * b, w * b)


def space_to_depth(x: np.ndarray, b: int, mode: str = "DCR", op: str = "SpaceToDepth"):
    """The inverse of depth_to_space with the same mode."""
    n, c, h, w = _check(x, op)
    if h % b or w % b:
        raise ValueError(f"{op}: spatial size {h}x{w} is not a multiple of blocksize {b}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return t.reshape(n, c * b * b, h // b, w // b)


def _check(x: np.ndarray, op: str) -> tuple[int, int, int, int]:
    if x.ndim != 4:
        raise ValueError(f"{op}: input {list(x.shape)} must be (N, C, H, W)")
    return x.shape
