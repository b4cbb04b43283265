"""Gradient compression with local error feedback (Seide et al.'s 1-bit SGD, Deep500's slides).

A ``Compressor`` turns a flat gradient into a fixed-size byte payload and back. With error
feedback it keeps, per rank, what compression left out (the residual) and adds it to the next
gradient, so nothing is lost, only delayed: after any number of steps,
``sum(decompressed payloads) + residual == sum(raw gradients)``. Every rank's payload has the
same size, so one ``Allgather`` exchanges them; each rank then decompresses and sums them all.

>>> c = TopK(4, np.float64, ratio=0.5)
>>> payload = c.compress(np.array([3.0, -1.0, 0.5, -4.0]))
>>> c.decompress(payload).tolist(), c.residual.tolist(), c.payload_bytes
([3.0, 0.0, 0.0, -4.0], [0.0, -1.0, 0.5, 0.0], 24)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Sequence

import numpy as np

from meta.common.component import ComponentError, Option, Registry

Seed = int | Sequence[int] | None


class Compressor:
    """Base: ``encode``/``decode_add`` define the format; error feedback is shared.

    ``n`` and ``dtype`` are those of the flat gradient; ``payload_bytes`` is what one rank
    sends per step. ``seed`` seeds ``rng``, which stochastic compressors draw from (give each
    rank its own seed: their rounding noise then averages out over the ranks).
    """

    error_feedback = True
    """Whether what compression lost (``residual``) is added to the next step's gradient before
    compressing it."""
    options: ClassVar[dict[str, Option]] = {}
    """What a recipe may set for this compressor (``compression_options``), declared here."""

    def __init__(self, n: int, dtype: np.dtype | type, seed: Seed = None) -> None:
        self.n = int(n)
        """Values in the flat gradient."""
        self.dtype = np.dtype(dtype)
        """The flat gradient's dtype."""
        self.residual = np.zeros(self.n, self.dtype)
        """What the last compression lost, fed back into the next gradient (zeros without error
        feedback)."""
        self._decoded = np.zeros(self.n, self.dtype)
        self.rng = np.random.default_rng(seed)
        """The generator stochastic compressors draw from (seeded per rank)."""

    @property
    def payload_bytes(self) -> int:
        raise NotImplementedError

    def encode(self, values: np.ndarray) -> np.ndarray:
        """``values`` (length n) as a uint8 payload of ``payload_bytes``."""
        raise NotImplementedError

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        """Add the values ``payload`` stands for to ``out``."""
        raise NotImplementedError

    def compress(self, grad: np.ndarray) -> np.ndarray:
        if grad.shape != (self.n,):
            raise ValueError(f"{type(self).__name__}.compress: expected a flat gradient of "
                             f"{self.n} values, got shape {grad.shape}")
        if not self.error_feedback:
            return self.encode(grad)
        corrected = self.residual
        corrected += grad  # the residual buffer now holds gradient + carried error
        payload = self.encode(corrected)
        corrected -= self.decompress(payload)  # and now what this payload left out
        return payload

    def decompress(self, payload: np.ndarray) -> np.ndarray:
        """The dense values of ``payload`` (a buffer reused by the next call)."""
        self._decoded.fill(0)
        self.decode_add(payload, self._decoded)
        return self._decoded


class Float16(Compressor):
    """Cast to IEEE half precision: half the bytes of float32; rounding is not fed back."""

    error_feedback = False
    """No: half precision's rounding is not fed back."""

    @property
    def payload_bytes(self) -> int:
        return 2 * self.n

    def encode(self, values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16).view(np.uint8)

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        out += payload.view(np.float16)


class TopK(Compressor):
    """The ``ratio * n`` largest magnitudes, as (values, int32 indices); the rest is fed back."""

    options = {"ratio": Option(0.01, "the share of values sent", above=0.0, high=1.0)}
    """``ratio``: the share of the values sent."""

    def __init__(self, n: int, dtype: np.dtype | type, ratio: float = 0.01,
                 seed: Seed = None) -> None:
        super().__init__(n, dtype, seed)
        if not 0 < ratio <= 1:
            raise ValueError(f"TopK: ratio must be in (0, 1], got {ratio}")
        self.k = max(1, min(self.n, round(ratio * self.n)))
        """Values sent per step: ``ratio * n``, at least 1."""

    @property
    def payload_bytes(self) -> int:
        return self.k * (self.dtype.itemsize + 4)

    def encode(self, values: np.ndarray) -> np.ndarray:
        index = np.argpartition(np.abs(values), self.n - self.k)[self.n - self.k :]
        index = index.astype(np.int32)
        return np.concatenate([values[index].view(np.uint8), index.view(np.uint8)])

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        split = self.k * self.dtype.itemsize
        index = payload[split:].view(np.int32)
        out[index] += payload[:split].view(self.dtype)  # indices are distinct within a payload


class Sign(Compressor):
    """One bit per value (its sign) and one scale, the mean magnitude: 32x smaller than float32."""

    @property
    def payload_bytes(self) -> int:
        return self.dtype.itemsize + (self.n + 7) // 8

    def encode(self, values: np.ndarray) -> np.ndarray:
        scale = np.array([np.abs(values).mean() if self.n else 0], self.dtype)
        return np.concatenate([scale.view(np.uint8), np.packbits(values >= 0)])

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        scale = payload[: self.dtype.itemsize].view(self.dtype)[0]
        bits = np.unpackbits(payload[self.dtype.itemsize :], count=self.n)
        out += scale * (2 * bits.astype(self.dtype) - 1)


# Compressions by name, as ``Allreduce``'s ``compression`` option chooses them; a compressor
# class declares its options in ``options`` (meta.lv3.data_parallel.quantization adds qsgd and
# terngrad).
COMPRESSIONS = Registry("compression", context=("n", "dtype", "seed"))
COMPRESSIONS.add("fp16", Float16)
COMPRESSIONS.add("topk", TopK)
COMPRESSIONS.add("sign", Sign)


def compression_options() -> dict[str, Option]:
    """Every registered compressor's options under the names a strategy offers them,
    ``<compression>_<option>`` (``topk_ratio``, ``qsgd_bits``): one flat list of recipe
    options, derived from the compressors' own declarations."""
    return {f"{name}_{key}": replace(option, doc=f"compression {name}: {option.doc}")
            for name, component in COMPRESSIONS.entries.items()
            for key, option in component.options.items()}


def make_compressor(name: str, n: int, dtype: np.dtype | type, seed: Seed = None,
                    **options: Any) -> Compressor | None:
    """The compressor called ``name`` for a flat gradient of ``n`` values; None for "none".

    ``options`` are named as a strategy offers them (``topk_ratio=0.05``, ``qsgd_bits=4``);
    those of other compressors are ignored, so a strategy can pass all of its own.
    """
    offered = compression_options()
    wrong = sorted(set(options) - set(offered))
    if wrong:
        raise ComponentError(f"unknown compression option {wrong[0]!r}; expected one of "
                             f"{', '.join(offered)}")
    if name == "none":
        return None
    if name not in COMPRESSIONS:
        raise ComponentError(f"unknown compression {name!r}; expected none or one of "
                             f"{', '.join(COMPRESSIONS.names())}")
    prefix = f"{name}_"
    mine = {k[len(prefix):]: v for k, v in options.items() if k.startswith(prefix)}
    component = COMPRESSIONS[name]
    return component.factory(n, dtype, seed=seed, **component.resolve(mine))
