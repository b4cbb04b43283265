"""Datasets: in-memory arrays, and the IDX image datasets (MNIST, Fashion-MNIST), found or fetched.

A file comes from the folder named by the source's environment variable when it is set (nothing is
ever downloaded then: that is how offline machines and CI pin their data), else from a per-user
cache filled from the source's mirrors. Every ``.gz`` file is checked against its published md5.

>>> train = mnist("train")  # doctest: +SKIP
>>> x, y = train.batch(np.arange(32))  # doctest: +SKIP
>>> x.shape, x.dtype, y.dtype  # doctest: +SKIP
((32, 1, 28, 28), dtype('float32'), dtype('int64'))
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from meta.lv2.decoded_cache import cached_arrays
from meta.lv2.idx import IDXError, read_idx

__all__ = [
    "FASHION_MNIST_SOURCE", "IGNORE_INDEX", "MNIST_SOURCE", "ArrayDataset", "Dataset", "DatasetError", "IDXSource",
    "clear_cache", "data_folder", "fashion_mnist", "load_idx_dataset", "mnist", "resolve_file",
]

IGNORE_INDEX = -100  # a per-position target the loss and metrics skip (PyTorch's default)
DOWNLOAD_TIMEOUT = 30.0  # seconds without data before a mirror counts as failed
_CHUNK = 1 << 16


class DatasetError(RuntimeError):
    """A dataset file is missing, corrupt or could not be downloaded; the message says which."""


class Dataset(ABC):
    """Examples addressed by index; a sampler picks the indices, ``batch`` gathers them."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (inputs, labels) of the examples at ``indices``, stacked along axis 0."""


class ArrayDataset(Dataset):
    """A dataset held as two arrays whose first axis is the example.

    Labels are one class per example (N,), or one per position (N, T, ...) for models such as
    language models that predict at every position; ``IGNORE_INDEX`` (-100, PyTorch's) marks a
    position (padding) that the loss and the accuracy skip.

    >>> ds = ArrayDataset(np.zeros((4, 2)), np.arange(4))
    >>> [a.shape for a in ds.batch(np.array([3, 1]))]
    [(2, 2), (2,)]
    """

    def __init__(self, inputs: np.ndarray, labels: np.ndarray, vocabulary: Any = None) -> None:
        inputs, labels = np.asarray(inputs), np.asarray(labels)
        if inputs.ndim == 0 or labels.ndim == 0 or len(inputs) != len(labels):
            raise ValueError(f"ArrayDataset: inputs of shape {inputs.shape} and labels of shape "
                             f"{labels.shape} must have the same, non-scalar first axis")
        self.inputs = inputs
        self.labels = labels
        # What token ids mean (``meta.lv2.text.Vocabulary``) where the inputs are text: what
        # generation decodes samples with. None for any other data.
        self.vocabulary = vocabulary

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.inputs[indices], self.labels[indices]


@dataclass(frozen=True)
class IDXSource:
    """Where a downloadable IDX dataset lives and how to recognise its files.

    ``files`` maps a split to its (images, labels) file names, ``md5`` each ``.gz`` file name to its
    md5, ``mirrors`` are base URLs tried in order, ``env_var`` names the variable that points to a
    local folder holding the files; ``mean``/``std`` are the train-set pixel statistics (in [0, 1])
    used to standardise; every label must be one of the ``classes`` classes ``0..classes-1``.
    """

    name: str
    files: dict[str, tuple[str, str]]
    md5: dict[str, str]
    mirrors: tuple[str, ...]
    env_var: str
    mean: float = 0.0
    std: float = 1.0
    classes: int = 10

    def __post_init__(self) -> None:
        unchecked = [f for pair in self.files.values() for f in pair if f not in self.md5]
        if unchecked:
            raise ValueError(f"IDXSource {self.name!r}: no md5 for {', '.join(unchecked)}")


_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

MNIST_SOURCE = IDXSource(
    name="mnist",
    files=_MNIST_FILES,
    md5={
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    mirrors=(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ),
    env_var="META_MNIST_DIR",
    mean=0.1307,
    std=0.3081,
)

FASHION_MNIST_SOURCE = IDXSource(
    name="fashion-mnist",
    files=_MNIST_FILES,
    md5={  # the md5s zalandoresearch/fashion-mnist publishes
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    env_var="META_FASHION_MNIST_DIR",
    # Computed once over the 60000 train images scaled to [0, 1]: 0.28604..., 0.35302...
    mean=0.2860,
    std=0.3530,
)


def data_folder(source: IDXSource) -> tuple[Path, bool]:
    """The folder the source's files come from, and whether the user chose it (by its env var)."""
    if chosen := os.environ.get(source.env_var):
        return Path(chosen).expanduser(), True
    return _cache_root() / "datasets" / source.name, False


def _cache_root() -> Path:
    """meta's per-user cache: $META_CACHE_DIR, else $XDG_CACHE_HOME/meta, else ~/.cache/meta."""
    if root := os.environ.get("META_CACHE_DIR"):
        return Path(root).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "meta"
    return Path.home() / ".cache" / "meta"


def resolve_file(source: IDXSource, filename: str, *, download: bool = True,
                 download_progress: bool = True) -> Path:
    """A verified local path for one of the source's files, downloading it into the cache if needed.

    In a user-chosen folder the uncompressed file (the name without ``.gz``) is also accepted.
    """
    folder, chosen = data_folder(source)
    return _resolve(source, folder, chosen, filename, download, download_progress)


def load_idx_dataset(source: IDXSource, split: str = "train", *, download: bool = True,
                     normalize: bool = True, download_progress: bool = True) -> ArrayDataset:
    """Load one split: float32 images (N, 1, H, W) in [0, 1], standardised unless ``normalize``
    is False, and int64 labels (N,).

    Loaded arrays are kept for the life of the process (read-only, so no caller can change what
    the next one gets); loading the same split again is free. The decoded arrays are also kept
    on disk under the per-user cache (``decoded/``, see ``meta.lv2.decoded_cache``) and mapped
    by every later process, which then skips the decode.
    """
    if split not in source.files:
        raise ValueError(f"{source.name}: unknown split {split!r}, expected one of "
                         f"{sorted(source.files)}")
    folder, chosen = data_folder(source)
    request = _Request(source.name, split, folder.resolve(), normalize,
                       source=source, chosen=chosen, download=download, progress=download_progress)
    return ArrayDataset(*_load_arrays(request))


def mnist(split: str = "train", **kwargs: Any) -> ArrayDataset:
    """MNIST handwritten digits; see ``load_idx_dataset`` for the keyword arguments."""
    return load_idx_dataset(MNIST_SOURCE, split, **kwargs)


def fashion_mnist(split: str = "train", **kwargs: Any) -> ArrayDataset:
    """Fashion-MNIST clothing images; see ``load_idx_dataset`` for the keyword arguments."""
    return load_idx_dataset(FASHION_MNIST_SOURCE, split, **kwargs)


def clear_cache() -> None:
    """Forget the datasets loaded in this process (the files on disk stay)."""
    _load_arrays.cache_clear()


@dataclass(frozen=True)
class _Request:
    # Only the compared fields say what gets loaded, so only they form the cache key.
    name: str
    split: str
    folder: Path
    normalize: bool
    source: IDXSource = field(compare=False)
    chosen: bool = field(compare=False)
    download: bool = field(compare=False)
    progress: bool = field(compare=False)


@functools.lru_cache(maxsize=8)
def _load_arrays(req: _Request) -> tuple[np.ndarray, np.ndarray]:
    paths = [_resolve(req.source, req.folder, req.chosen, f, req.download, req.progress)
             for f in req.source.files[req.split]]
    # Decoded once per machine (meta.lv2.decoded_cache), not once per process: what it is
    # decoded from is named by content, so a changed file or source is a new entry.
    source = req.source
    key = repr((source.name, req.split, req.normalize, source.mean, source.std, source.classes,
                [_content_id(source, p) for p in paths]))
    stem = f"{req.split}-{'normalized' if req.normalize else 'unit'}"
    arrays = cached_arrays(_cache_root() / "decoded" / source.name, stem, key,
                           lambda: _decode(req, paths))
    x, y = arrays["x"], arrays["y"]
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _content_id(source: IDXSource, path: Path) -> str:
    """What a resolved file holds: a ``.gz`` file's md5, which ``_resolve`` has just checked
    against the source's, else (an uncompressed file in a user's folder) its size and CRC-32."""
    if path.name.endswith(".gz"):
        return f"md5 {source.md5[path.name]}"
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DatasetError(f"{path}: cannot read it ({err.strerror or err})") from err
    return f"{len(data)} bytes, crc32 {zlib.crc32(data):08x}"


def _decode(req: _Request, paths: list[Path]) -> dict[str, np.ndarray]:
    try:
        images, labels = read_idx(paths[0]), read_idx(paths[1])
    except IDXError as err:  # a raw file is checked by its structure only: its message names it
        raise DatasetError(f"{err}; replace the file (the {req.name} {req.split} split)") from err
    except OSError as err:
        raise DatasetError(f"{err.filename or paths[0]}: cannot read it "
                           f"({err.strerror or err})") from err
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DatasetError(f"{paths[0]}: expected uint8 images of shape (N, H, W), "
                           f"got {images.dtype} of shape {images.shape}")
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetError(f"{paths[0]} holds {len(images)} images but {paths[1]} holds labels "
                           f"of shape {labels.shape}")
    _check_labels(labels, paths[1], req.source)
    return {"x": _scale(images, req.source, req.normalize), "y": labels.astype(np.int64)}


def _check_labels(labels: np.ndarray, path: Path, source: IDXSource) -> None:
    """Every label is an integer class ``0..classes-1``: a label out of range would otherwise
    fail deep inside the loss, or index another row, many steps later."""
    if labels.dtype.kind not in "iu":
        raise DatasetError(f"{path}: labels must be integers, the file holds {labels.dtype}")
    bad = np.flatnonzero((labels < 0) | (labels >= source.classes))
    if bad.size:
        first = int(bad[0])
        raise DatasetError(f"{path}: label {int(labels[first])} at index {first} is outside the "
                           f"{source.classes} classes 0..{source.classes - 1} of {source.name} "
                           f"({bad.size} such label(s)); a wrong or corrupt labels file")


def _scale(images: np.ndarray, source: IDXSource, normalize: bool) -> np.ndarray:
    x = images.reshape(len(images), 1, *images.shape[1:]).astype(np.float32)
    x /= 255  # in place: the train set is 188 MB as float32
    if normalize:
        x -= source.mean
        x /= source.std
    return x


def _resolve(source: IDXSource, folder: Path, chosen: bool, filename: str, download: bool,
             progress: bool) -> Path:
    if chosen:
        return _user_file(source, folder, filename)
    return _cached_file(source, folder, filename, download, progress)


def _user_file(source: IDXSource, folder: Path, filename: str) -> Path:
    path, expected = folder / filename, source.md5[filename]
    if path.is_file():
        _check_md5(path, expected)
        return path
    raw = folder / filename.removesuffix(".gz")
    if raw.is_file():
        return raw  # only the .gz md5 is published; read_idx still checks the structure
    raise DatasetError(f"{path} not found (nor {raw.name}): ${source.env_var} points to {folder}, "
                       f"which must hold the {source.name} file {filename} (md5 {expected})")


def _cached_file(source: IDXSource, folder: Path, filename: str, download: bool,
                 progress: bool) -> Path:
    path, expected = folder / filename, source.md5[filename]
    if path.is_file() and _md5(path) == expected:
        return path
    if not download:
        state = f"has md5 {_md5(path)}" if path.is_file() else "is missing"
        raise DatasetError(f"{path} {state} (expected md5 {expected}) and download=False; set "
                           f"${source.env_var} to a folder holding {filename}")
    folder.mkdir(parents=True, exist_ok=True)
    failures = []
    for mirror in source.mirrors:
        url = mirror.rstrip("/") + "/" + filename
        try:
            _download(url, path, expected, progress)
            return path
        except (OSError, ValueError, http.client.HTTPException) as err:
            failures.append(f"  {url}: {_reason(err)}")
    raise DatasetError(f"could not download {filename} (md5 {expected}) into {folder}; tried:\n"
                       + "\n".join(failures) + f"\nset ${source.env_var} to a folder holding "
                       f"the {source.name} files to use them without downloading")


def _download(url: str, dest: Path, expected_md5: str, progress: bool) -> None:
    # Into a temporary file beside dest, renamed only once verified: no reader, and no other
    # process downloading the same file, ever sees a partial or wrong file under the real name.
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(
                url, timeout=DOWNLOAD_TIMEOUT) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name, file=sys.stderr,
                      leave=False, disable=None if progress else True) as bar:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        if digest.hexdigest() != expected_md5:
            raise ValueError(f"md5 {digest.hexdigest()} does not match the expected {expected_md5}")
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _reason(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return f"HTTP {err.code} {err.reason}"
    if isinstance(err, urllib.error.URLError):
        return str(err.reason)
    return str(err) or type(err).__name__


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_md5(path: Path, expected: str) -> None:
    actual = _md5(path)
    if actual != expected:
        raise DatasetError(f"{path}: md5 {actual} does not match the expected {expected} "
                           "(a corrupt, truncated or different file)")


def synthetic(num_examples: int, input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10,
              seed: int = 0, noise: float = 1.0, split: int = 0) -> ArrayDataset:
    """Gaussian blobs around one random centre per class: learnable, instant, for benchmarks
    and tests that must not depend on downloaded data. Splits of one seed share the centres
    and differ in their draws."""
    rng = np.random.default_rng([seed, 2, split])
    centres = np.random.default_rng([seed, 1]).standard_normal((classes, *input_shape))
    labels = rng.integers(0, classes, num_examples)
    inputs = centres[labels] + noise * rng.standard_normal((num_examples, *input_shape))
    return ArrayDataset(inputs.astype(np.float32), labels.astype(np.int64))
