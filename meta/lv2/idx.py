"""IDX files (the MNIST format): read and write, raw or gzip-compressed.

An IDX file is two zero bytes, a dtype code, the number of dimensions, one big-endian uint32 per
dimension, then the values in C order, big-endian. Everything is checked, because a half-downloaded
or mislabelled file otherwise shows up much later as a silently wrong dataset.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IDXError", "read_idx", "write_idx"]

# IDX dtype code -> big-endian numpy dtype as stored on disk.
DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODES: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in DTYPES.items()}


class IDXError(ValueError):
    """A file is not a valid IDX file; the message names the file and what is wrong."""


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed if its name ends in ``.gz``) into a native-endian array.

    >>> import tempfile, numpy as np
    >>> f = Path(tempfile.mkdtemp()) / "x-idx2-ubyte.gz"
    >>> write_idx(f, np.arange(6, dtype=np.uint8).reshape(2, 3))
    >>> read_idx(f).tolist()
    [[0, 1, 2], [3, 4, 5]]
    """
    path = Path(path)
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = _gunzip(path, data)
    return _parse(path, data)


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, gzip-compressed if the name ends in ``.gz``.

    The gzip header carries no timestamp, so the same array always gives the same bytes (and md5).
    """
    path = Path(path)
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _CODES:
        supported = ", ".join(str(dt.newbyteorder("=")) for dt in DTYPES.values())
        raise IDXError(f"{path}: cannot write dtype {array.dtype} as IDX (supported: {supported})")
    if array.ndim > 255 or any(n >= 2**32 for n in array.shape):
        raise IDXError(f"{path}: shape {array.shape} does not fit an IDX header")
    code = _CODES[native]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + np.ascontiguousarray(array, dtype=DTYPES[code]).tobytes()
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)


def _gunzip(path: Path, data: bytes) -> bytes:
    try:
        return gzip.decompress(data)
    except EOFError as err:
        raise IDXError(f"{path}: truncated gzip stream ({err})") from err
    except (OSError, zlib.error) as err:
        raise IDXError(f"{path}: corrupt gzip stream ({err})") from err


def _parse(path: Path, data: bytes) -> np.ndarray:
    if len(data) < 4:
        raise IDXError(f"{path}: truncated header: {len(data)} bytes, an IDX file has at least 4")
    if data[0] != 0 or data[1] != 0:
        raise IDXError(f"{path}: bad magic {data[:4].hex(' ')}: an IDX file starts with two zero "
                       "bytes (is it compressed without a .gz name?)")
    code, ndim = data[2], data[3]
    if code not in DTYPES:
        known = ", ".join(f"0x{c:02X}" for c in DTYPES)
        raise IDXError(f"{path}: unknown IDX dtype code 0x{code:02X} (known: {known})")
    start = 4 + 4 * ndim
    if len(data) < start:
        raise IDXError(f"{path}: truncated header: {ndim} dimensions need {start} bytes, "
                       f"the file has {len(data)}")
    shape = struct.unpack(f">{ndim}I", data[4:start])
    dtype = DTYPES[code]
    expected = math.prod(shape) * dtype.itemsize
    actual = len(data) - start
    if actual < expected:
        raise IDXError(f"{path}: truncated payload: shape {shape} of {dtype.newbyteorder('=')} "
                       f"needs {expected} bytes, the file has {actual}")
    if actual > expected:
        raise IDXError(f"{path}: {actual - expected} trailing bytes after the payload of shape "
                       f"{shape} of {dtype.newbyteorder('=')} ({expected} bytes)")
    return np.frombuffer(data, dtype, offset=start).reshape(shape).astype(dtype.newbyteorder("="))
