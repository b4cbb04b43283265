"""The ``reduction`` attribute shared by the loss operators: mean, sum or none (per element)."""

from __future__ import annotations

import numpy as np

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: unknown reduction {reduction!r} (expected one of "
                         f"{', '.join(REDUCTIONS)})")


def reduce_loss(loss: np.ndarray, reduction: str, denom: float) -> np.ndarray:
    """Per-element losses reduced; ``mean`` divides by ``denom`` (the count or total weight)."""
    if reduction == "none":
        return loss
    total = loss.sum()
    return np.asarray(total / denom if reduction == "mean" else total, dtype=loss.dtype)


def per_element_grad(dloss: np.ndarray, reduction: str, shape: tuple[int, ...],
                     denom: float) -> np.ndarray:
    """d(reduced loss)/d(per-element loss), times the incoming gradient, in ``shape``."""
    if reduction == "none":
        return dloss
    return np.broadcast_to(dloss / denom if reduction == "mean" else dloss, shape)
