"""PyTorch's kinks held at float32's decisions: which ReLU / ReLU6 / max-pool outputs pass, as
one float32 forward pass decided them, replayed in a later pass (autocast bf16).

Why: on a ReLU network a unit whose input lies within bf16's rounding of the kink goes the
other way in bf16 and moves the gradient of everything before it by that unit's whole
gradient. Replaying float32's decisions in an autocast pass leaves bf16's rounding of the
products and nothing else, so the difference the replay removes is the kinks' share
(``bf16_gradients.py``'s "autocast, float32's kinks" column).

    kinks = Kinks()
    with kinks.recording():
        float32_loss = loss_of(x, y)           # decisions saved in call order
    with kinks.replaying(), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_of(x, y)                   # the same decisions, bf16 products

It patches ``torch.relu``, ``torch.nn.functional.relu``, ``hardtanh`` (``nn.ReLU6``) and
``max_pool2d`` for the duration of the ``with`` only; the replayed pass must call them in the
same order (one forward of the same model and batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

F = torch.nn.functional


class Kinks:
    """The kinks' decisions of one recorded forward pass, replayed in order."""

    def __init__(self) -> None:
        self.saved: list[torch.Tensor] = []
        self.replay = False
        self.at = 0
        self.original: dict = {}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        self.saved, self.replay = [], False
        with self._patched():
            yield

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        self.replay, self.at = True, 0
        with self._patched():
            yield
        if self.at != len(self.saved):
            raise RuntimeError(f"replayed {self.at} of {len(self.saved)} recorded kinks: "
                               "not the recorded model's forward pass")

    def _decision(self, value: torch.Tensor) -> torch.Tensor:
        if not self.replay:
            self.saved.append(value)
            return value
        if self.at >= len(self.saved):
            raise RuntimeError(f"more kinks than the {len(self.saved)} recorded")
        value = self.saved[self.at]
        self.at += 1
        return value

    def _relu(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        keep = self._decision((x > 0).detach())
        return torch.where(keep, x, torch.zeros((), dtype=x.dtype))

    def _hardtanh(self, x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0,
                  inplace: bool = False) -> torch.Tensor:
        keep = self._decision(((x > min_val) & (x < max_val)).detach())
        return torch.where(keep, x, x.detach().clamp(min_val, max_val))

    def _max_pool2d(self, x: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1,
                    ceil_mode: bool = False, return_indices: bool = False) -> torch.Tensor:
        _, where = self.original["max_pool2d"](x.detach(), kernel_size, stride, padding,
                                               dilation, ceil_mode, True)
        where = self._decision(where)
        out = x.flatten(2).gather(2, where.flatten(2)).view(where.shape)
        return (out, where) if return_indices else out

    @contextlib.contextmanager
    def _patched(self) -> Iterator[None]:
        self.original = {"relu": F.relu, "torch.relu": torch.relu, "hardtanh": F.hardtanh,
                         "max_pool2d": F.max_pool2d}
        F.relu, torch.relu = self._relu, self._relu
        F.hardtanh, F.max_pool2d = self._hardtanh, self._max_pool2d
        try:
            yield
        finally:
            F.relu, torch.relu = self.original["relu"], self.original["torch.relu"]
            F.hardtanh = self.original["hardtanh"]
            F.max_pool2d = self.original["max_pool2d"]
