"""Stochastic quantization (QSGD, TernGrad): unbiased rounding, honest packed sizes, error
feedback, options as recipes set them; the quantized allreduce under ``mpiexec -n 2``
(``quantize_batch_checks.py``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from meta.common.component import ComponentError
from meta.lv3 import SingleProcessCommunicator, StochasticQuantizer, Ternary, make_compressor
from meta.lv3.data_parallel.quantization import pack_codes, unpack_codes
from meta.run.recipe import AtLeast, RecipeError, make_recipe

from . import quantize_batch_checks as checks

SCRIPT = str(Path(checks.__file__))
DRAWS = 4000


def grid_step(c: StochasticQuantizer | Ternary, v: np.ndarray) -> np.ndarray:
    """The spacing of the levels each value of ``v`` is rounded between (from its bucket)."""
    blocks = np.zeros(c.buckets * c.bucket_size)
    blocks[: len(v)] = v
    blocks = blocks.reshape(c.buckets, c.bucket_size)
    if isinstance(c, Ternary):
        step = np.abs(blocks).max(1)
    elif c.norm == "max":
        step = np.abs(blocks).max(1) / c.levels
    else:
        step = np.linalg.norm(blocks, axis=1) / c.levels
    return np.repeat(step, c.bucket_size)[: len(v)]


def bias_z_scores(c: StochasticQuantizer | Ternary, v: np.ndarray, draws: int = DRAWS
                  ) -> np.ndarray:
    """|mean of ``draws`` decodings - v| in standard errors of that mean, per value: rounding
    between levels ``step`` apart has variance step**2 * f * (1 - f), f the fractional part."""
    total = np.zeros(len(v))
    for _ in range(draws):
        total += c.decompress(c.compress(v))
    mean = total / draws
    step = grid_step(c, v.astype(np.float64))
    x = np.abs(v) / step
    fraction = x - np.floor(x)
    se = step * np.sqrt(fraction * (1 - fraction) / draws)
    exact = se < 1e-6 * step  # on a level: no randomness, the mean must be the value itself
    assert np.allclose(mean[exact], v[exact], rtol=1e-5, atol=1e-7)
    return np.abs(mean - v)[~exact] / se[~exact]


QUANTIZERS = {
    "qsgd 2 bits": lambda: StochasticQuantizer(48, np.float32, bits=2, bucket_size=16, seed=1),
    "qsgd 3 bits l2": lambda: StochasticQuantizer(48, np.float32, bits=3, bucket_size=16,
                                                  norm="l2", seed=2),
    "qsgd 4 bits": lambda: StochasticQuantizer(48, np.float32, bits=4, bucket_size=16, seed=3),
    "qsgd 8 bits": lambda: StochasticQuantizer(48, np.float32, bits=8, bucket_size=16, seed=4),
    "terngrad": lambda: Ternary(48, np.float32, bucket_size=16, seed=5),
}


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizers_are_unbiased(name: str) -> None:
    """The mean of many decodings lies within 5 standard errors of the value, for each of 48
    values (a false alarm has odds below 1e-5): rounding to the nearest level fails this."""
    v = np.random.default_rng(0).normal(size=48).astype(np.float32)
    z = bias_z_scores(QUANTIZERS[name](), v)
    assert z.max() < 5.0, (name, z.max())


class NearestRounding(StochasticQuantizer):
    """Deterministic rounding: what the unbiasedness check exists to catch."""

    def rounded(self, x: np.ndarray) -> np.ndarray:
        return np.round(x)


def test_the_unbiasedness_check_catches_biased_rounding() -> None:
    v = np.random.default_rng(0).normal(size=48).astype(np.float32)
    z = bias_z_scores(NearestRounding(48, np.float32, bits=3, bucket_size=16, seed=0), v, 500)
    assert z.max() > 10  # twice the bound the unbiased ones meet


@pytest.mark.parametrize("bits", range(2, 9))
def test_packed_codes_round_trip_in_bits_per_value(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2 ** bits, 1001).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.dtype == np.uint8 and packed.nbytes == -(-1001 * bits // 8)
    np.testing.assert_array_equal(unpack_codes(packed, 1001, bits), codes)


@pytest.mark.parametrize("bits", range(2, 9))
def test_qsgd_payload_is_k_bits_per_value_plus_scales(bits: int) -> None:
    """1000 float32 values in buckets of 128: 8 scales of 4 bytes, then the packed levels;
    values already on the levels come back exactly (up to float32 rounding)."""
    c = StochasticQuantizer(1000, np.float32, bits=bits, bucket_size=128, seed=0)
    assert c.payload_bytes == 8 * 4 + -(-1000 * bits // 8)
    rng = np.random.default_rng(bits)
    levels = rng.integers(-c.levels, c.levels + 1, 1000)
    levels[::128] = c.levels  # every bucket reaches the top level: its scale is 2.0
    v = (levels * (2.0 / c.levels)).astype(np.float32)
    payload = c.compress(v)
    assert payload.dtype == np.uint8 and payload.nbytes == c.payload_bytes
    np.testing.assert_allclose(c.decompress(payload), v, rtol=1e-6, atol=1e-6)


def test_ternary_payload_packs_five_values_per_byte() -> None:
    c = Ternary(1000, np.float32, bucket_size=500, seed=0)
    assert c.payload_bytes == 2 * 4 + 200  # 1.6 bits per value
    v = np.random.default_rng(0).choice([-3.0, 0.0, 3.0], 1000).astype(np.float32)
    payload = c.compress(v)
    assert payload.nbytes == c.payload_bytes
    np.testing.assert_array_equal(c.decompress(payload), v)  # on the levels: exact
    assert Ternary(235146, np.float32).payload_bytes * 19 < 4 * 235146  # the MLP: ~19x fewer


@pytest.mark.parametrize("name", ["qsgd", "terngrad"])
def test_error_feedback_carries_what_rounding_left_out(name: str) -> None:
    c = make_compressor(name, 100, np.float64, seed=0, **{f"{name}_error_feedback": True,
                                                          f"{name}_bucket_size": 32})
    raw, sent = np.zeros(100), np.zeros(100)
    rng = np.random.default_rng(3)
    for _ in range(30):
        grad = rng.normal(size=100)
        sent += c.decompress(c.compress(grad))
        raw += grad
    np.testing.assert_allclose(sent + c.residual, raw, atol=1e-10)
    plain = make_compressor(name, 100, np.float64, seed=0)
    plain.compress(rng.normal(size=100))
    assert not plain.residual.any()  # without feedback nothing is carried


def test_zero_buckets_and_a_short_tail() -> None:
    c = StochasticQuantizer(10, np.float32, bits=4, bucket_size=4, seed=0)
    v = np.array([0, 0, 0, 0, 1, -2, 0.5, 0, 7, -7], np.float32)
    assert c.payload_bytes == 3 * 4 + 5
    decoded = c.decompress(c.compress(v))
    assert np.isfinite(decoded).all() and not decoded[:4].any()
    np.testing.assert_array_equal(decoded[8:], [7, -7])


def test_options_are_checked_where_recipes_set_them() -> None:
    with pytest.raises(ComponentError, match="compression 'qsgd': option 'bits' must be at "
                                             "most 8, got 9"):
        make_compressor("qsgd", 10, np.float32, qsgd_bits=9)
    with pytest.raises(ComponentError, match="unknown compression option 'qsgd_bitz'"):
        make_compressor("qsgd", 10, np.float32, qsgd_bitz=2)
    with pytest.raises(ComponentError, match="'norm' must be one of max, l2"):
        make_compressor("qsgd", 10, np.float32, qsgd_norm="l1")
    with pytest.raises(RecipeError, match="option 'qsgd_bits' must be at least 2, got 1"):
        make_recipe("r", {"compression": "qsgd", "qsgd_bits": 1}, {},
                    {"test_accuracy": AtLeast(0.5)})
    assert make_compressor("topk", 100, np.float32, topk_ratio=0.1, qsgd_bits=2).k == 10


def test_ranks_draw_different_rounding() -> None:
    """Each rank's own stream: rounding noise averages out over ranks instead of adding up."""
    v = np.random.default_rng(0).normal(size=256).astype(np.float32)
    a = make_compressor("qsgd", 256, np.float32, seed=[0, 0], qsgd_bits=2).compress(v)
    b = make_compressor("qsgd", 256, np.float32, seed=[0, 1], qsgd_bits=2).compress(v)
    again = make_compressor("qsgd", 256, np.float32, seed=[0, 0], qsgd_bits=2).compress(v)
    assert not np.array_equal(a, b) and np.array_equal(a, again)


# -- the quantized allreduce under MPI ----------------------------------------------------------

QUANTIZED_CHECKS = [n for n in checks.CHECKS if n.startswith("quantized")]


@pytest.mark.parametrize("name", QUANTIZED_CHECKS)
def test_checks_on_one_process(name: str) -> None:
    checks.CHECKS[name](SingleProcessCommunicator())


@pytest.mark.mpi
@pytest.mark.slow
def test_quantized_allreduce_under_mpiexec(mpirun: Callable[..., str]) -> None:
    out = mpirun(2, [sys.executable, SCRIPT, *QUANTIZED_CHECKS], timeout=120)
    for rank in range(2):
        assert f"rank {rank}/2: {len(QUANTIZED_CHECKS)} checks passed" in out, out
