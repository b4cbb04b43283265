"""Stochastic quantization of gradients: QSGD's k-bit levels and TernGrad's ternary values.

Each bucket of ``bucket_size`` consecutive values shares one scale; every value is rounded to
one of a few levels of that scale, up or down at random with the probabilities that make the
expectation exact (Alistarh et al. 2017, QSGD; Wen et al. 2017, TernGrad; seed 004: "the main
trick is stochastic rounding — the expectation is more accurate"). Unbiased rounding needs no
error feedback to converge, since the noise averages out over steps and ranks; with
``error_feedback`` each rank also carries what its rounding left out into its next gradient.
The levels are packed into bytes, so ``payload_bytes`` is what really travels.

>>> q = StochasticQuantizer(4, np.float32, bits=2, bucket_size=4, seed=0)
>>> q.payload_bytes  # one float32 scale, then 4 values of 2 bits
5
>>> q.decompress(q.compress(np.array([1.0, -1.0, 0.0, 1.0], np.float32))).tolist()
[1.0, -1.0, 0.0, 1.0]
"""

from __future__ import annotations

import numpy as np

from meta.common.component import Option
from meta.lv3.data_parallel.compression import COMPRESSIONS, Compressor, Seed

_BUCKET = Option(512, "values sharing one scale", low=1)
_FEEDBACK = Option(False, "carry the rounding error into the next step (unbiased without)")
_TRITS_PER_BYTE = 5  # 3**5 = 243 codes fit in a byte: 1.6 bits per ternary value
_TRIT_WEIGHTS = 3 ** np.arange(_TRITS_PER_BYTE, dtype=np.uint8)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of every uint8 in ``codes``, packed back to back into bytes."""
    if bits == 8:
        return codes
    if 8 % bits == 0:  # 2 or 4 bits: whole codes per byte, shifted into place
        per = 8 // bits
        padded = np.zeros(-(-len(codes) // per) * per, np.uint8)
        padded[: len(codes)] = codes
        columns = padded.reshape(-1, per)
        packed = columns[:, 0].copy()
        for j in range(1, per):  # a few strided passes beat a reduction along the short axis
            packed |= columns[:, j] << np.uint8(j * bits)
        return packed
    planes = np.unpackbits(codes[:, None], axis=1, count=bits, bitorder="little")
    return np.packbits(planes)


def unpack_codes(payload: np.ndarray, n: int, bits: int) -> np.ndarray:
    """The ``n`` codes of ``bits`` bits each that ``pack_codes`` packed, as uint8."""
    if bits == 8:
        return payload[:n]
    if 8 % bits == 0:
        mask = np.uint8((1 << bits) - 1)
        return ((payload[:, None] >> _shifts(bits)) & mask).ravel()[:n]
    planes = np.unpackbits(payload, count=n * bits).reshape(n, bits)
    return np.packbits(planes, axis=1, bitorder="little")[:, 0]


def _shifts(bits: int) -> np.ndarray:
    return np.arange(0, 8, bits, dtype=np.uint8)


class BucketedQuantizer(Compressor):
    """Base: the gradient cut into buckets, each with one scale sent ahead of its codes."""

    def __init__(self, n: int, dtype: np.dtype | type, bucket_size: int = 512,
                 error_feedback: bool = False, seed: Seed = None) -> None:
        super().__init__(n, dtype, seed)
        if bucket_size < 1:
            raise ValueError(f"{type(self).__name__}: bucket_size must be at least 1, "
                             f"got {bucket_size}")
        self.bucket_size = int(bucket_size)
        """Values per bucket, each with its own scale."""
        self.buckets = -(-self.n // self.bucket_size)
        """Buckets in the gradient (the last one padded with zeros)."""
        self.error_feedback = bool(error_feedback)
        """Whether the quantization error is fed back into the next gradient."""
        self._padded = np.zeros(self.buckets * self.bucket_size, self.dtype)
        self._levels = np.zeros_like(self._padded)  # decoding's, zeros past n

    @property
    def scale_bytes(self) -> int:
        return self.buckets * self.dtype.itemsize

    @property
    def payload_bytes(self) -> int:
        return self.scale_bytes + self.code_bytes

    @property
    def code_bytes(self) -> int:
        raise NotImplementedError

    def blocks(self, values: np.ndarray) -> np.ndarray:
        """``values`` as (buckets, bucket_size) rows, the tail padded with zeros."""
        self._padded[: self.n] = values
        return self._padded.reshape(self.buckets, self.bucket_size)

    def rounded(self, x: np.ndarray) -> np.ndarray:
        """``x`` rounded down or up to an integer, up with probability ``x - floor(x)``: the
        expectation is ``x`` exactly."""
        low = np.floor(x)
        return low + (self.rng.random(x.shape, dtype=np.float32) < x - low)

    def scales_and_codes(self, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return payload[: self.scale_bytes].view(self.dtype), payload[self.scale_bytes :]

    def add_scaled(self, levels: np.ndarray, step: np.ndarray, out: np.ndarray) -> None:
        """``out += levels * step`` of each value's bucket (``levels``: n small integers)."""
        self._levels[: self.n] = levels
        blocks = self._levels.reshape(self.buckets, self.bucket_size)
        blocks *= step[:, None]
        out += self._levels[: self.n]


class StochasticQuantizer(BucketedQuantizer):
    """QSGD: ``bits`` per value, a sign and one of ``2**(bits-1) - 1`` magnitude levels of the
    bucket's scale, rounded stochastically; 8x fewer bytes than float32 at 4 bits.

    ``norm`` is the scale: ``max`` (the largest magnitude: every level used, the least
    variance at few bits) or ``l2`` (the bucket's Euclidean norm, the QSGD paper's).
    """

    options = {"bits": Option(4, "bits per value (sign and magnitude level)", low=2, high=8),
               "bucket_size": _BUCKET,
               "norm": Option("max", "the bucket's scale: max (largest magnitude) or l2",
                              choices=("max", "l2")),
               "error_feedback": _FEEDBACK}
    """``bits``, ``bucket_size``, ``norm`` and ``error_feedback``, as a recipe sets them."""

    def __init__(self, n: int, dtype: np.dtype | type, bits: int = 4, bucket_size: int = 512,
                 norm: str = "max", error_feedback: bool = False, seed: Seed = None) -> None:
        super().__init__(n, dtype, bucket_size, error_feedback, seed)
        if not 2 <= bits <= 8:
            raise ValueError(f"StochasticQuantizer: bits must be in [2, 8], got {bits}")
        if norm not in ("max", "l2"):
            raise ValueError(f"StochasticQuantizer: norm must be max or l2, got {norm!r}")
        self.bits, self.norm = int(bits), norm
        """``bits``: bits per value (sign and magnitude level). ``norm``: the bucket's scale,
        "max" or "l2"."""
        self.levels = 2 ** (self.bits - 1) - 1
        """codes 0 .. 2 * levels: -levels .. +levels"""

    @property
    def code_bytes(self) -> int:
        return -(-self.n * self.bits // 8)

    def encode(self, values: np.ndarray) -> np.ndarray:
        blocks = self.blocks(values)
        scale = np.abs(blocks).max(1) if self.norm == "max" else np.linalg.norm(blocks, axis=1)
        scale = scale.astype(self.dtype)
        to_levels = np.divide(self.levels, scale, out=np.zeros_like(scale), where=scale > 0)
        # |x| <= levels up to rounding of the division: clipping keeps codes in range
        x = np.clip(blocks * to_levels[:, None], -self.levels, self.levels)
        codes = (self.rounded(x) + self.levels).astype(np.uint8).ravel()[: self.n]
        return np.concatenate([scale.view(np.uint8), pack_codes(codes, self.bits)])

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        scale, packed = self.scales_and_codes(payload)
        levels = unpack_codes(packed, self.n, self.bits).astype(self.dtype) - self.levels
        self.add_scaled(levels, scale / self.levels, out)


class Ternary(BucketedQuantizer):
    """TernGrad: every value becomes -1, 0 or +1 times its bucket's largest magnitude, non-zero
    with probability ``|value| / scale``; five values packed per byte (1.6 bits each, 20x
    fewer bytes than float32)."""

    options = {"bucket_size": _BUCKET, "error_feedback": _FEEDBACK}
    """``bucket_size`` and ``error_feedback``, as a recipe sets them."""

    @property
    def code_bytes(self) -> int:
        return -(-self.n // _TRITS_PER_BYTE)

    def encode(self, values: np.ndarray) -> np.ndarray:
        blocks = self.blocks(values)
        scale = np.abs(blocks).max(1).astype(self.dtype)
        inverse = np.divide(1, scale, out=np.zeros_like(scale), where=scale > 0)
        keep = self.rounded(np.minimum(np.abs(blocks) * inverse[:, None], 1))
        trits = (np.sign(blocks) * keep + 1).astype(np.uint8).ravel()[: self.n]
        padded = np.ones(self.code_bytes * _TRITS_PER_BYTE, np.uint8)  # pads with code 0
        padded[: self.n] = trits
        groups = padded.reshape(-1, _TRITS_PER_BYTE)
        packed = groups[:, 0].copy()
        for j in range(1, _TRITS_PER_BYTE):
            packed += groups[:, j] * _TRIT_WEIGHTS[j]
        return np.concatenate([scale.view(np.uint8), packed])

    def decode_add(self, payload: np.ndarray, out: np.ndarray) -> None:
        scale, packed = self.scales_and_codes(payload)
        trits = (packed[:, None] // _TRIT_WEIGHTS) % 3
        signs = trits.ravel()[: self.n].astype(self.dtype) - 1
        self.add_scaled(signs, scale, out)


COMPRESSIONS.add("qsgd", StochasticQuantizer)
COMPRESSIONS.add("terngrad", Ternary)
