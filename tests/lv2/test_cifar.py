"""CIFAR-10 binary batches, on small files written here in the real format."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import tarfile

import numpy as np
import pytest

from meta.lv2 import cifar
from meta.lv2.cifar import RECORD, SPLITS, cifar10, parse_batch
from meta.lv2.datasets import DatasetError

from .test_datasets import Server


def batch_bytes(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    records = rng.integers(0, 256, (n, RECORD), dtype=np.uint8)
    records[:, 0] = rng.integers(0, 10, n)
    return records.tobytes()


def files() -> dict[str, bytes]:
    names = SPLITS["train"] + SPLITS["test"]
    return {name: batch_bytes(4 + i, i) for i, name in enumerate(names)}


def archive(blobs: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in blobs.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("META_CIFAR10_DIR", raising=False)
    cifar._load.cache_clear()
    yield
    cifar._load.cache_clear()


def test_parse_batch_layout():
    data = batch_bytes(3, 0)
    x, y = parse_batch(data, "b")
    raw = np.frombuffer(data, np.uint8).reshape(3, RECORD)
    assert x.shape == (3, 3, 32, 32) and y.tolist() == raw[:, 0].tolist()
    assert x[1, 2, 0, 5] == raw[1, 1 + 2 * 1024 + 5]  # blue plane, row 0, column 5


@pytest.mark.parametrize("layout", ["flat", "nested", "archive"])
def test_user_folder_layouts(tmp_path, monkeypatch, layout):
    blobs = files()
    folder = tmp_path / "data"
    target = folder / "cifar-10-batches-bin" if layout == "nested" else folder
    target.mkdir(parents=True)
    if layout == "archive":
        (folder / "cifar-10-binary.tar.gz").write_bytes(archive(blobs))
    else:
        for name, data in blobs.items():
            (target / name).write_bytes(data)
    monkeypatch.setenv("META_CIFAR10_DIR", str(folder))
    train, test = cifar10("train"), cifar10("test", normalize=False)
    assert len(train) == 4 + 5 + 6 + 7 + 8 and len(test) == 9
    x, y = test.batch(np.arange(9))
    assert x.shape == (9, 3, 32, 32) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1
    assert y.tolist() == list(np.frombuffer(blobs["test_batch.bin"], np.uint8)[::RECORD])


def test_bad_files_are_named(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("META_CIFAR10_DIR", str(folder))
    with pytest.raises(DatasetError, match="data_batch_1.bin not found: \\$META_CIFAR10_DIR"):
        cifar10("train")
    for name, data in files().items():
        (folder / name).write_bytes(data)
    (folder / "test_batch.bin").write_bytes(batch_bytes(2, 0)[:-5])
    with pytest.raises(DatasetError, match="test_batch.bin: 6141 bytes is not a whole number"):
        cifar10("test")
    bad = bytearray(batch_bytes(2, 0))
    bad[0] = 12
    (folder / "test_batch.bin").write_bytes(bytes(bad))
    with pytest.raises(DatasetError, match="label 12 is out of range"):
        cifar10("test")


def test_download_checks_md5_and_reads_the_archive(monkeypatch):
    blob = archive(files())
    server = Server({"cifar-10-binary.tar.gz": blob})
    try:
        md5 = hashlib.md5(blob).hexdigest()
        source = dataclasses.replace(cifar.CIFAR10_SOURCE, md5={cifar.ARCHIVE: md5},
                                     mirrors=(server.url("missing"), server.url("good")))
        monkeypatch.setattr(cifar, "CIFAR10_SOURCE", source)
        assert len(cifar10("test")) == 9
        assert server.requests[-1].endswith("/good/cifar-10-binary.tar.gz")
        bad = dataclasses.replace(source, md5={cifar.ARCHIVE: "0" * 32},
                                  mirrors=(server.url("corrupt"),))
        monkeypatch.setattr(cifar, "CIFAR10_SOURCE", bad)
        cifar._load.cache_clear()
        with pytest.raises(DatasetError, match="could not download cifar-10-binary.tar.gz"):
            cifar10("train")
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
