"""The on-disk cache of decoded datasets: a hit maps the entry without decoding, a changed source
is a new entry, a damaged entry is rebuilt (never used), processes starting together build once,
and an unwritable cache folder only costs the decode."""

from __future__ import annotations

import json
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import meta.lv2.datasets as datasets
from meta.lv2.decoded_cache import cached_arrays
from meta.lv2.idx import write_idx
from tests.lv2.test_datasets import ARRAYS, ENV, FILES, _assert_tiny


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path / "cache"))
    datasets.clear_cache()
    yield
    datasets.clear_cache()


@pytest.fixture
def source() -> datasets.IDXSource:
    """test_datasets' tiny source (its md5s are never asked: the files are uncompressed)."""
    return datasets.IDXSource("tiny", FILES, dict.fromkeys(ARRAYS, "0" * 32), (), ENV,
                              mean=0.5, std=0.25)


@pytest.fixture
def raw_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny dataset as uncompressed files (no md5: named by content), chosen by $ENV."""
    folder = tmp_path / "user"
    folder.mkdir()
    for name, array in ARRAYS.items():
        write_idx(folder / name.removesuffix(".gz"), array)
    monkeypatch.setenv(ENV, str(folder))
    return folder


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The splits this process decodes from the IDX files, in order."""
    calls: list[str] = []
    real = datasets._decode

    def counted(req, paths):
        calls.append(req.split)
        return real(req, paths)

    monkeypatch.setattr(datasets, "_decode", counted)
    return calls


def _entry(tmp_path: Path, stem: str = "train-normalized") -> list[Path]:
    return sorted((tmp_path / "cache" / "decoded" / "tiny").glob(f"{stem}-*"))


def test_a_second_process_maps_the_entry_instead_of_decoding(raw_folder, source, decodes,
                                                              tmp_path) -> None:
    _assert_tiny(datasets.load_idx_dataset(source))
    assert decodes == ["train"]
    assert [p.name.split(".", 1)[1] for p in _entry(tmp_path)] == ["json", "x.npy", "y.npy"]
    datasets.clear_cache()  # what a new process starts with
    again = datasets.load_idx_dataset(source)
    assert decodes == ["train"]  # a hit: nothing decoded
    _assert_tiny(again)
    assert isinstance(again.inputs.base, np.memmap) and not again.inputs.flags.writeable
    datasets.load_idx_dataset(source, normalize=False)  # another entry, not the same one
    assert decodes == ["train", "train"]


def test_a_changed_source_file_is_a_new_entry(raw_folder, source, decodes, tmp_path) -> None:
    datasets.load_idx_dataset(source)
    first = set(_entry(tmp_path))
    after = []
    for value in (1, 2):
        changed = ARRAYS["tr-img.gz"].copy()
        changed[0, 0, 0] ^= value  # same size, one pixel different
        write_idx(raw_folder / "tr-img", changed)
        os.utime(raw_folder / "tr-img", (1, 1))  # nor does the time tell it apart
        datasets.clear_cache()
        x = datasets.load_idx_dataset(source).inputs
        assert x[0, 0, 0, 0] == np.float32((changed[0, 0, 0] / np.float32(255) - 0.5) / 0.25)
        after.append(set(_entry(tmp_path)))
    assert decodes == ["train", "train", "train"]
    # The latest other entry stays (two sources of one name used in turn keep theirs); the one
    # before it, a stale source's, is removed.
    second = after[0] - first
    assert len(first) == len(second) == 3 and after[0] == first | second
    third = after[1] - after[0]
    assert len(third) == 3 and after[1] == second | third


@pytest.mark.parametrize("damage", ["truncated array", "flipped byte", "garbage manifest",
                                    "missing array", "wrong shape"])
def test_a_damaged_entry_is_rebuilt_not_used(raw_folder, source, decodes, tmp_path,
                                             damage) -> None:
    datasets.load_idx_dataset(source)
    manifest, x_file, _ = _entry(tmp_path)
    if damage == "truncated array":
        x_file.write_bytes(x_file.read_bytes()[:-8])
    elif damage == "flipped byte":
        data = bytearray(x_file.read_bytes())
        data[-1] ^= 0x40
        x_file.write_bytes(bytes(data))
    elif damage == "garbage manifest":
        manifest.write_text("{not json")
    elif damage == "missing array":
        x_file.unlink()
    else:
        info = json.loads(manifest.read_text())
        info["arrays"]["x"]["shape"] = [4, 1, 4, 4]
        manifest.write_text(json.dumps(info))
    datasets.clear_cache()
    _assert_tiny(datasets.load_idx_dataset(source))
    assert decodes == ["train", "train"]
    datasets.clear_cache()
    _assert_tiny(datasets.load_idx_dataset(source))  # and the rebuilt entry is a hit
    assert decodes == ["train", "train"]


def test_an_unwritable_cache_folder_only_costs_the_decode(raw_folder, source, decodes, tmp_path,
                                                          monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("META_CACHE_DIR", str(blocker))
    _assert_tiny(datasets.load_idx_dataset(source))
    datasets.clear_cache()
    _assert_tiny(datasets.load_idx_dataset(source))
    assert decodes == ["train", "train"]


def test_errors_of_the_source_are_not_cached(raw_folder, source, tmp_path) -> None:
    write_idx(raw_folder / "tr-lab", np.array([0, 1, 12, 3, 4], np.uint8))
    for _ in range(2):
        datasets.clear_cache()
        with pytest.raises(datasets.DatasetError, match="label 12 at index 2"):
            datasets.load_idx_dataset(source)
    assert _entry(tmp_path) == []


def test_processes_starting_together_build_once(tmp_path) -> None:
    # flock locks belong to an open file, so two threads stand for two processes here.
    building, release = threading.Event(), threading.Event()
    builds: list[str] = []
    results: dict[str, dict[str, np.ndarray]] = {}

    def build(who: str):
        def run():
            builds.append(who)
            building.set()
            release.wait(10)
            return {"a": np.arange(6.0).reshape(2, 3)}
        return run

    def load(who: str) -> None:
        results[who] = cached_arrays(tmp_path, "s", "k", build(who))

    first = threading.Thread(target=load, args=("first",))
    first.start()
    assert building.wait(10)
    second = threading.Thread(target=load, args=("second",))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting on the first one's lock, not building
    release.set()
    first.join(10)
    second.join(10)
    assert builds == ["first"]
    np.testing.assert_array_equal(results["second"]["a"], np.arange(6.0).reshape(2, 3))
    assert isinstance(results["second"]["a"].base, np.memmap)


def test_the_manifest_checksums_each_array(tmp_path) -> None:
    arrays = cached_arrays(tmp_path, "s", "k", lambda: {"a": np.arange(4, dtype=np.int32)})
    (manifest,) = tmp_path.glob("s-*.json")
    info = json.loads(manifest.read_text())
    assert info["arrays"]["a"] == {"dtype": "int32", "shape": [4],
                                   "crc32": zlib.crc32(np.arange(4, dtype=np.int32))}
    assert arrays["a"].tolist() == [0, 1, 2, 3]


def test_a_folder_others_may_write_is_not_used(raw_folder, source, decodes, tmp_path) -> None:
    datasets.load_idx_dataset(source)
    folder = tmp_path / "cache" / "decoded" / "tiny"
    assert folder.stat().st_mode & 0o777 == 0o700  # made private
    folder.chmod(0o777)  # anyone could have put an entry there
    datasets.clear_cache()
    _assert_tiny(datasets.load_idx_dataset(source))
    assert decodes == ["train", "train"]
