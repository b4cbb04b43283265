"""Datasets: in-memory arrays, IDX sources in a user folder, the cache, and mirrors on loopback."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from meta.lv2.datasets import (
    FASHION_MNIST_SOURCE,
    MNIST_SOURCE,
    ArrayDataset,
    DatasetError,
    IDXSource,
    clear_cache,
    data_folder,
    load_idx_dataset,
)
from meta.lv2.idx import write_idx

REPO = Path(__file__).resolve().parents[2]
ENV = "META_TEST_TINY_DIR"
FILES = {"train": ("tr-img.gz", "tr-lab.gz"), "test": ("te-img.gz", "te-lab.gz")}
rng = np.random.default_rng(0)
ARRAYS = {
    "tr-img.gz": rng.integers(0, 256, (5, 4, 4), dtype=np.uint8),
    "tr-lab.gz": np.arange(5, dtype=np.uint8),
    "te-img.gz": rng.integers(0, 256, (3, 4, 4), dtype=np.uint8),
    "te-lab.gz": np.array([2, 0, 1], dtype=np.uint8),
}


def _gz_bytes(tmp: Path, name: str) -> bytes:
    write_idx(tmp / name, ARRAYS[name])
    return (tmp / name).read_bytes()


@pytest.fixture
def blobs(tmp_path: Path) -> dict[str, bytes]:
    """The tiny dataset's .gz files as bytes (write_idx output is deterministic)."""
    tmp = tmp_path / "blobs"
    tmp.mkdir()
    return {name: _gz_bytes(tmp, name) for name in ARRAYS}


def _source(blobs: dict[str, bytes], mirrors: tuple[str, ...] = ()) -> IDXSource:
    md5 = {name: hashlib.md5(data).hexdigest() for name, data in blobs.items()}
    return IDXSource("tiny", FILES, md5, mirrors, ENV, mean=0.5, std=0.25)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("no_proxy", "*")  # loopback servers must not go through a proxy
    monkeypatch.setenv("NO_PROXY", "*")
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def user_folder(tmp_path: Path, blobs: dict[str, bytes],
                monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    for name, data in blobs.items():
        (folder / name).write_bytes(data)
    monkeypatch.setenv(ENV, str(folder))
    return folder


def _damaged(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 0xFF])


class Server:
    """A loopback HTTP server: /good/<f> serves the files, /corrupt/<f> wrong bytes, else 404."""

    def __init__(self, blobs: dict[str, bytes]) -> None:
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.requests.append(self.path)
                folder, _, name = self.path.strip("/").partition("/")
                if name in blobs and folder in ("good", "corrupt"):
                    body = blobs[name] if folder == "good" else _damaged(blobs[name])
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, folder: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{folder}/"


@pytest.fixture
def server(blobs: dict[str, bytes]) -> Iterator[Server]:
    s = Server(blobs)
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    s.thread.join()


def _assert_tiny(ds: ArrayDataset, split: str = "train") -> None:
    images, labels = (ARRAYS[f] for f in FILES[split])
    assert len(ds) == len(images)
    assert ds.inputs.shape == (len(images), 1, 4, 4) and ds.inputs.dtype == np.float32
    assert ds.labels.dtype == np.int64
    expected = (images[:, None].astype(np.float32) / 255 - 0.5) / 0.25
    np.testing.assert_allclose(ds.inputs, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(ds.labels, labels)


# --- ArrayDataset -----------------------------------------------------------------------------

def test_array_dataset_batch() -> None:
    ds = ArrayDataset(np.arange(10).reshape(5, 2), np.arange(5) * 10)
    x, y = ds.batch(np.array([4, 0]))
    assert len(ds) == 5
    np.testing.assert_array_equal(x, [[8, 9], [0, 1]])
    np.testing.assert_array_equal(y, [40, 0])


def test_array_dataset_length_mismatch() -> None:
    with pytest.raises(ValueError, match=r"\(5, 2\).*\(4,\)"):
        ArrayDataset(np.zeros((5, 2)), np.zeros(4))


# --- sources and folders ----------------------------------------------------------------------

def test_source_needs_md5_for_every_file(blobs: dict[str, bytes]) -> None:
    source = _source(blobs)
    md5 = {k: v for k, v in source.md5.items() if k != "te-lab.gz"}
    with pytest.raises(ValueError, match=r"te-lab\.gz"):
        dataclasses.replace(source, md5=md5)


def test_builtin_sources() -> None:
    for source in (MNIST_SOURCE, FASHION_MNIST_SOURCE):
        assert set(source.files) == {"train", "test"}
        assert all(len(m) == 32 for m in source.md5.values())
    assert MNIST_SOURCE.env_var == "META_MNIST_DIR"
    assert FASHION_MNIST_SOURCE.env_var == "META_FASHION_MNIST_DIR"


def test_cache_folder_order(blobs: dict[str, bytes], tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    source = _source(blobs)
    assert data_folder(source) == (tmp_path / "cache" / "datasets" / "tiny", False)
    monkeypatch.delenv("META_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_folder(source) == (tmp_path / "xdg" / "meta" / "datasets" / "tiny", False)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_folder(source) == (tmp_path / "home" / ".cache" / "meta" / "datasets" / "tiny",
                                   False)
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert data_folder(source) == (tmp_path / "mine", True)


def test_unknown_split(blobs: dict[str, bytes]) -> None:
    with pytest.raises(ValueError, match="'valid'"):
        load_idx_dataset(_source(blobs), "valid")


# --- a folder chosen by the environment variable ----------------------------------------------

def test_user_folder(user_folder: Path, blobs: dict[str, bytes]) -> None:
    source = _source(blobs)
    _assert_tiny(load_idx_dataset(source, "train"))
    _assert_tiny(load_idx_dataset(source, "test"), "test")
    raw = load_idx_dataset(source, "test", normalize=False)
    np.testing.assert_allclose(raw.inputs[:, 0] * 255, ARRAYS["te-img.gz"], atol=1e-4)


def test_user_folder_accepts_uncompressed_files(user_folder: Path,
                                                blobs: dict[str, bytes]) -> None:
    for name, array in ARRAYS.items():
        (user_folder / name).unlink()
        write_idx(user_folder / name.removesuffix(".gz"), array)
    _assert_tiny(load_idx_dataset(_source(blobs), "train"))


def test_user_folder_missing_file(user_folder: Path, blobs: dict[str, bytes]) -> None:
    (user_folder / "tr-lab.gz").unlink()
    source = _source(blobs)
    with pytest.raises(DatasetError) as info:
        load_idx_dataset(source, "train")
    message = str(info.value)
    assert str(user_folder / "tr-lab.gz") in message
    assert ENV in message and source.md5["tr-lab.gz"] in message


def test_user_folder_md5_mismatch(user_folder: Path, blobs: dict[str, bytes]) -> None:
    (user_folder / "tr-img.gz").write_bytes(blobs["te-img.gz"])
    source = _source(blobs)
    with pytest.raises(DatasetError) as info:
        load_idx_dataset(source, "train")
    message = str(info.value)
    assert str(user_folder / "tr-img.gz") in message
    assert source.md5["tr-img.gz"] in message and source.md5["te-img.gz"] in message


def test_user_folder_never_downloads(user_folder: Path, blobs: dict[str, bytes],
                                     server: Server) -> None:
    (user_folder / "tr-img.gz").unlink()
    with pytest.raises(DatasetError, match=ENV):
        load_idx_dataset(_source(blobs, (server.url("good"),)), "train")
    assert server.requests == []


def test_image_and_label_counts_must_agree(user_folder: Path, blobs: dict[str, bytes]) -> None:
    source = dataclasses.replace(_source(blobs), files={"train": ("tr-img.gz", "te-lab.gz")})
    with pytest.raises(DatasetError) as info:
        load_idx_dataset(source, "train")
    assert str(user_folder / "tr-img.gz") in str(info.value)
    assert str(user_folder / "te-lab.gz") in str(info.value)


@pytest.mark.parametrize("damage, problem", [
    (lambda data: data[:-3], "truncated payload"),
    (lambda data: data[:6], "truncated header"),
    (lambda data: b"\x1f\x8b" + data[2:], "bad magic"),
])
def test_corrupt_raw_file_is_a_dataset_error_naming_it(user_folder: Path, blobs: dict[str, bytes],
                                                       damage, problem) -> None:
    # Raw (uncompressed) files have no published md5: only their structure can be checked.
    (user_folder / "tr-img.gz").unlink()
    raw = user_folder / "tr-img"
    write_idx(raw, ARRAYS["tr-img.gz"])
    raw.write_bytes(damage(raw.read_bytes()))
    with pytest.raises(DatasetError, match=problem) as info:
        load_idx_dataset(_source(blobs), "train")
    message = str(info.value)
    assert str(raw) in message and "\n" not in message
    assert load_idx_dataset(_source(blobs), "test").labels.tolist() == [2, 0, 1]  # still usable


@pytest.mark.parametrize("labels, bad", [
    (np.array([0, 1, 12, 3, 4], np.uint8), "label 12 at index 2"),
    (np.array([0, 1, 2, -1, 4], np.int32), "label -1 at index 3"),
])
def test_labels_outside_the_classes_are_refused(user_folder: Path, blobs: dict[str, bytes],
                                                labels: np.ndarray, bad: str) -> None:
    (user_folder / "tr-lab.gz").unlink()
    write_idx(user_folder / "tr-lab", labels)
    with pytest.raises(DatasetError, match=bad) as info:
        load_idx_dataset(_source(blobs), "train")
    message = str(info.value)
    assert str(user_folder / "tr-lab") in message and "0..9" in message and "\n" not in message


def test_float_labels_are_refused(user_folder: Path, blobs: dict[str, bytes]) -> None:
    (user_folder / "tr-lab.gz").unlink()
    write_idx(user_folder / "tr-lab", np.arange(5, dtype=np.float32))
    with pytest.raises(DatasetError, match="labels must be integers"):
        load_idx_dataset(_source(blobs), "train")


def test_the_number_of_classes_is_the_source_s(user_folder: Path,
                                               blobs: dict[str, bytes]) -> None:
    source = dataclasses.replace(_source(blobs), classes=4)  # the train labels are 0..4
    with pytest.raises(DatasetError, match="label 4 at index 4 is outside the 4 classes 0..3"):
        load_idx_dataset(source, "train")


def test_in_process_cache_is_shared_and_read_only(user_folder: Path,
                                                  blobs: dict[str, bytes]) -> None:
    source = _source(blobs)
    first, second = load_idx_dataset(source), load_idx_dataset(source)
    assert first.inputs is second.inputs and first.labels is second.labels
    with pytest.raises(ValueError, match="read-only"):
        first.inputs[0] = 0
    with pytest.raises(ValueError, match="read-only"):
        first.labels[0] = 0
    x, _ = first.batch(np.array([0, 1]))
    x[:] = 0  # a batch is the caller's own copy
    assert load_idx_dataset(source, normalize=False).inputs is not first.inputs
    clear_cache()
    assert load_idx_dataset(source).inputs is not first.inputs


# --- the download cache -----------------------------------------------------------------------

def _cache(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "datasets" / "tiny"


def test_download_skips_404_mirror_and_caches(server: Server, blobs: dict[str, bytes],
                                              tmp_path: Path) -> None:
    source = _source(blobs, (server.url("missing"), server.url("good")))
    _assert_tiny(load_idx_dataset(source, "train", download_progress=False))
    assert server.requests == ["/missing/tr-img.gz", "/good/tr-img.gz",
                               "/missing/tr-lab.gz", "/good/tr-lab.gz"]
    assert sorted(os.listdir(_cache(tmp_path))) == ["tr-img.gz", "tr-lab.gz"]
    clear_cache()
    _assert_tiny(load_idx_dataset(source, "train"))
    assert len(server.requests) == 4  # served from the cache folder


def test_corrupt_mirror_falls_through(server: Server, blobs: dict[str, bytes],
                                      tmp_path: Path) -> None:
    source = _source(blobs, (server.url("corrupt"), server.url("good")))
    _assert_tiny(load_idx_dataset(source, "test", download_progress=False), "test")
    assert server.requests[:2] == ["/corrupt/te-img.gz", "/good/te-img.gz"]
    assert (_cache(tmp_path) / "te-img.gz").read_bytes() == blobs["te-img.gz"]
    assert sorted(os.listdir(_cache(tmp_path))) == ["te-img.gz", "te-lab.gz"]  # no temp files


def test_cached_file_with_wrong_md5_is_replaced(server: Server, blobs: dict[str, bytes],
                                                tmp_path: Path) -> None:
    source = _source(blobs, (server.url("good"),))
    _cache(tmp_path).mkdir(parents=True)
    (_cache(tmp_path) / "tr-img.gz").write_bytes(b"stale")
    with pytest.raises(DatasetError, match=hashlib.md5(b"stale").hexdigest()):
        load_idx_dataset(source, "train", download=False)
    _assert_tiny(load_idx_dataset(source, "train"))
    assert (_cache(tmp_path) / "tr-img.gz").read_bytes() == blobs["tr-img.gz"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_all_mirrors_fail(server: Server, blobs: dict[str, bytes], tmp_path: Path) -> None:
    refused = f"http://127.0.0.1:{_closed_port()}/x/"
    source = _source(blobs, (server.url("missing"), server.url("corrupt"), refused))
    with pytest.raises(DatasetError) as info:
        load_idx_dataset(source, "train", download_progress=False)
    message = str(info.value)
    assert f"{server.url('missing')}tr-img.gz: HTTP 404" in message
    assert f"{server.url('corrupt')}tr-img.gz: md5" in message
    assert f"{refused}tr-img.gz: " in message
    assert "tr-img.gz" in message and source.md5["tr-img.gz"] in message and ENV in message
    assert os.listdir(_cache(tmp_path)) == []  # nothing half-written left behind


def test_download_false(server: Server, blobs: dict[str, bytes], tmp_path: Path) -> None:
    source = _source(blobs, (server.url("good"),))
    with pytest.raises(DatasetError) as info:
        load_idx_dataset(source, "train", download=False)
    message = str(info.value)
    assert str(_cache(tmp_path) / "tr-img.gz") in message and ENV in message
    assert server.requests == []


# --- the real datasets ------------------------------------------------------------------------

def _real_folder(env_var: str, name: str) -> Path:
    # CI points the variable at ../shared/datasets/<name>, relative to the repository.
    chosen = os.environ.get(env_var)
    folder = Path(chosen) if chosen else REPO.parent / "shared" / "datasets" / name
    folder = folder if folder.is_absolute() else REPO / folder
    if not folder.is_dir():
        pytest.skip(f"no {name} folder at {folder} (set ${env_var} to a folder holding it)")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("source", [MNIST_SOURCE, FASHION_MNIST_SOURCE], ids=lambda s: s.name)
def test_real_dataset(source: IDXSource, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(source.env_var, str(_real_folder(source.env_var, source.name)))
    for split, n in (("train", 60000), ("test", 10000)):
        ds = load_idx_dataset(source, split, download=False)
        assert ds.inputs.shape == (n, 1, 28, 28) and ds.inputs.dtype == np.float32
        assert ds.labels.shape == (n,) and ds.labels.dtype == np.int64
        assert ds.labels.min() == 0 and ds.labels.max() == 9
        assert abs(float(ds.inputs.mean())) < 0.02
        assert abs(float(ds.inputs.std()) - 1) < 0.02
        clear_cache()
