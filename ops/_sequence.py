"""Sequence values: a Python list of arrays (ONNX ``seq(tensor)``), and optional values: the
value or None. The executors hold them as they hold arrays; the sequence operators run
forward only (no gradient flows through a sequence)."""

from __future__ import annotations

import numpy as np


def position(value, length: int, op: str, insert: bool = False) -> int:
    """A (possibly negative) position in a sequence of ``length``; ``insert`` allows
    ``length`` itself (after the end)."""
    p = int(np.reshape(value, -1)[0])
    p = p + length if p < 0 else p
    if not 0 <= p <= length - (0 if insert else 1):
        raise ValueError(f"{op}: position {int(np.reshape(value, -1)[0])} is out of range "
                         f"for a sequence of {length}")
    return p


def check_sequence(value, op: str) -> list:
    if not isinstance(value, list):
        raise TypeError(f"{op}: expected a sequence (list of tensors), got "
                        f"{type(value).__name__}")
    return value
