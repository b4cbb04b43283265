"""Standardisation shared by LayerNormalization, InstanceNormalization and GroupNormalization:
x_hat = (x - mean) / sqrt(var + eps) over some axes, and its backward."""

from __future__ import annotations

import numpy as np


def standardize(x: np.ndarray, axes: tuple[int, ...], eps: float):
    """(x_hat, mean, inv_std), the last two with kept dims; float maths in x's dtype."""
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    inv_std = np.reciprocal(np.sqrt(var + np.asarray(eps, x.dtype)))
    return centered * inv_std, mean, inv_std


def standardize_backward(dxhat: np.ndarray, xhat: np.ndarray, inv_std: np.ndarray,
                         axes: tuple[int, ...], dmean: np.ndarray | None = None,
                         dinv_std: np.ndarray | None = None) -> np.ndarray:
    """dL/dx from dL/dx_hat, plus gradients reaching the mean and inv_std outputs (if any)."""
    dx = inv_std * (dxhat - np.mean(dxhat, axis=axes, keepdims=True)
                    - xhat * np.mean(dxhat * xhat, axis=axes, keepdims=True))
    n = max(int(np.prod([xhat.shape[a] for a in axes])), 1)
    if dmean is not None:
        dx = dx + dmean / n
    if dinv_std is not None:  # d inv_std / dx = -inv_std^3 (x - mean) / n
        dx = dx - dinv_std * inv_std * inv_std * xhat / n
    return dx
