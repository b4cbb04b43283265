"""Sequence values: a Python list of arrays (ONNX ``seq(tensor)``), and optional values: the
value or None. The executors hold them as they hold arrays. A gradient flows through
SplitToSequence and SequenceAt (PyTorch's dynamo exporter writes ``Tensor.split`` so) as a
``SequenceGrad``; the other sequence operators run forward only."""

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


class SequenceGrad(list):
    """The gradient of a sequence: one entry per element, None where no gradient reached it.
    Executors accumulate gradients with ``+``, which here adds element by element (a list
    would concatenate)."""

    def __add__(self, other):  # type: ignore[override]
        if not isinstance(other, list) or len(other) != len(self):
            raise TypeError(f"cannot add a sequence gradient of {len(self)} to "
                            f"{type(other).__name__}")
        return SequenceGrad(b if a is None else a if b is None else a + b
                            for a, b in zip(self, other))

    __radd__ = __add__
