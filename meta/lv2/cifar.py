"""CIFAR-10 in its binary-batch format (the ``cifar-10-binary.tar.gz`` distribution).

Each record is 1 label byte and 3072 pixel bytes (the red, green and blue 32x32 planes). The
data come from a folder named by ``$META_CIFAR10_DIR`` (holding the ``.bin`` files, directly or
in ``cifar-10-batches-bin/``, or the ``.tar.gz``) or are downloaded once, md5-checked, into the
cache, and read straight from the archive.
"""

from __future__ import annotations

import functools
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meta.lv2.datasets import ArrayDataset, DatasetError, _cached_file, data_folder

RECORD = 1 + 3 * 32 * 32
SPLITS = {"train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)), "test": ("test_batch.bin",)}
ARCHIVE = "cifar-10-binary.tar.gz"
# Per-channel mean and std of the training images in [0, 1] (published, widely used values).
MEAN = np.array([0.4914, 0.4822, 0.4465], np.float32).reshape(1, 3, 1, 1)
STD = np.array([0.2470, 0.2435, 0.2616], np.float32).reshape(1, 3, 1, 1)


@dataclass(frozen=True)
class ArchiveSource:
    """A dataset distributed as one archive: what the download machinery needs to know."""

    name: str
    md5: dict[str, str]
    mirrors: tuple[str, ...]
    env_var: str


CIFAR10_SOURCE = ArchiveSource(
    name="cifar-10",
    md5={ARCHIVE: "c32a1d4ab5d03f1284b67883e8d87530"},
    mirrors=("https://www.cs.toronto.edu/~kriz/",),
    env_var="META_CIFAR10_DIR",
)


def parse_batch(data: bytes, origin: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 from one batch file's bytes."""
    if len(data) == 0 or len(data) % RECORD:
        raise DatasetError(f"{origin}: {len(data)} bytes is not a whole number of "
                           f"{RECORD}-byte CIFAR-10 records (truncated or not a batch file)")
    records = np.frombuffer(data, np.uint8).reshape(-1, RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() > 9:
        raise DatasetError(f"{origin}: label {labels.max()} is out of range 0..9")
    return records[:, 1:].reshape(-1, 3, 32, 32), labels


def _read_folder(folder: Path, names: tuple[str, ...]) -> list[tuple[bytes, str]]:
    for base in (folder, folder / "cifar-10-batches-bin"):
        if all((base / n).is_file() for n in names):
            return [((base / n).read_bytes(), str(base / n)) for n in names]
    archive = folder / ARCHIVE
    if archive.is_file():
        return _read_archive(archive, names)
    raise DatasetError(f"{folder / names[0]} not found: ${CIFAR10_SOURCE.env_var} points to "
                       f"{folder}, which must hold {', '.join(names)} (or {ARCHIVE})")


def _read_archive(archive: Path, names: tuple[str, ...]) -> list[tuple[bytes, str]]:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            missing = [n for n in names if n not in members]
            if missing:
                raise DatasetError(f"{archive}: no {', '.join(missing)} inside")
            return [(tar.extractfile(members[n]).read(), f"{archive}:{n}") for n in names]
    except (tarfile.TarError, EOFError, OSError) as err:
        raise DatasetError(f"{archive}: unreadable archive ({err})") from err


@functools.lru_cache(maxsize=4)
def _load(split: str, folder: Path, chosen: bool, download: bool,
          normalize: bool) -> tuple[np.ndarray, np.ndarray]:
    names = SPLITS[split]
    if chosen:
        parts = _read_folder(folder, names)
    else:
        archive = _cached_file(CIFAR10_SOURCE, folder, ARCHIVE, download, True)
        parts = _read_archive(archive, names)
    batches = [parse_batch(data, origin) for data, origin in parts]
    x = np.concatenate([b[0] for b in batches]).astype(np.float32) / 255
    if normalize:
        x = (x - MEAN) / STD
    y = np.concatenate([b[1] for b in batches])
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def cifar10(split: str = "train", download: bool = True, normalize: bool = True) -> ArrayDataset:
    """CIFAR-10: float32 images (N, 3, 32, 32), standardised per channel unless ``normalize``
    is False, and int64 labels (N,)."""
    if split not in SPLITS:
        raise ValueError(f"cifar-10: unknown split {split!r}, expected one of {sorted(SPLITS)}")
    folder, chosen = data_folder(CIFAR10_SOURCE)
    return ArrayDataset(*_load(split, Path(os.path.abspath(folder)), chosen, download, normalize))
