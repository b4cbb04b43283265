"""IDX reader/writer: round trips for every dtype, and every corruption named with its file."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from meta.lv2.idx import IDXError, read_idx, write_idx

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip(tmp_path: Path, dtype: type, suffix: str) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    path = tmp_path / f"x-idx3{suffix}"
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    assert back.shape == (3, 4, 5)
    np.testing.assert_array_equal(back, array)


def test_big_endian_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1"
    write_idx(path, np.array([1, 258], dtype=np.int16))
    assert path.read_bytes() == bytes([0, 0, 0x0B, 1, 0, 0, 0, 2, 0, 1, 1, 2])


def test_reads_non_native_input_and_empty_arrays(tmp_path: Path) -> None:
    write_idx(tmp_path / "a", np.array([1.5, -2.0], dtype=">f8"))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), [1.5, -2.0])
    write_idx(tmp_path / "b.gz", np.zeros((0, 28, 28), dtype=np.uint8))
    assert read_idx(tmp_path / "b.gz").shape == (0, 28, 28)


def test_write_rejects_unsupported_dtype(tmp_path: Path) -> None:
    with pytest.raises(IDXError, match="int64"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.int64))


def _valid_bytes() -> bytes:
    return bytes([0, 0, 0x08, 2]) + struct.pack(">2I", 2, 3) + bytes(range(6))


CORRUPTIONS = {
    "bad magic": (b"\x01\x00" + _valid_bytes()[2:], "bad magic"),
    "unknown dtype": (bytes([0, 0, 0x0A, 2]) + _valid_bytes()[4:], "unknown IDX dtype code 0x0A"),
    "short header": (b"\x00\x00", "truncated header"),
    "short dims": (_valid_bytes()[:9], "truncated header"),
    "truncated payload": (_valid_bytes()[:-1], "truncated payload"),
    "trailing bytes": (_valid_bytes() + b"\x00\x00", "2 trailing bytes"),
}


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_file_names_file_and_problem(tmp_path: Path, case: str, suffix: str) -> None:
    data, problem = CORRUPTIONS[case]
    path = tmp_path / f"bad-idx{suffix}"
    path.write_bytes(gzip.compress(data) if suffix else data)
    with pytest.raises(IDXError, match=problem) as info:
        read_idx(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("damage, problem", [
    (lambda gz: gz[: len(gz) // 2], "truncated gzip"),
    (lambda gz: gz[:-8] + bytes(8), "corrupt gzip"),  # wrong CRC and size trailer
    (lambda gz: gz[:10] + b"\xff" * (len(gz) - 10), "corrupt gzip"),  # garbage deflate data
    (lambda gz: b"not gzip at all", "corrupt gzip"),
])
def test_corrupt_gzip_stream(tmp_path: Path, damage: Callable[[bytes], bytes],
                             problem: str) -> None:
    path = tmp_path / "x-idx2.gz"
    path.write_bytes(damage(gzip.compress(_valid_bytes())))
    with pytest.raises(IDXError, match=problem) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_idx_error_is_value_error() -> None:
    assert issubclass(IDXError, ValueError)
