"""Undoing numpy broadcasting in gradients: the one place every op calls for it."""

from __future__ import annotations

import numpy as np


def unbroadcast(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``grad`` over the axes that broadcasting added or stretched to reach its shape.

    >>> unbroadcast(np.ones((4, 3)), (3,)).tolist()
    [4.0, 4.0, 4.0]
    """
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra < 0:
        raise ValueError(f"cannot unbroadcast a gradient of shape {grad.shape} to {shape}")
    summed = grad.sum(axis=tuple(range(extra))) if extra else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and summed.shape[i] != 1)
    if stretched:
        summed = summed.sum(axis=stretched, keepdims=True)
    return summed.reshape(shape)
