"""The C++ op cache is private (issue 44): loading a library runs its code, so meta makes the
cache with mode 0700 and refuses, in one line, a cache folder or library another user could
have written. No compiler run here: ``_compile`` writes a stand-in library and ``_load`` says
which file it would load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from meta.lv0 import cpp_ops
from meta.lv0.cpp_ops import UnsafeCacheError

SWISH = Path(__file__).resolve().parents[2] / "examples" / "cpp_ops" / "swish.cpp"
OTHER = 65534  # nobody


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if shutil.which("c++") is None and shutil.which("g++") is None and "CXX" not in os.environ:
        pytest.skip("no C++ compiler to key the cache by")
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(cpp_ops, "_compile",
                        lambda command, source, library: library.write_text("stand-in"))
    monkeypatch.setattr(cpp_ops, "_load", lambda name, library: library)
    return tmp_path / "cache"


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_the_cache_is_made_private_by_default(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("META_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = cpp_ops.private_cache()
    assert root == tmp_path / "xdg" / "meta" / "cpp_ops"
    assert _mode(root) == _mode(root.parent) == 0o700


def test_a_build_folder_is_private_and_a_safe_library_loads(cache: Path) -> None:
    library = cpp_ops.build(SWISH)
    assert library.parent.parent == cache / "cpp_ops"
    assert _mode(cache / "cpp_ops") == _mode(library.parent) == 0o700
    assert cpp_ops.build(SWISH) == library  # a cache hit: the same, checked file


def _refused(what: str, path: Path, problem: str) -> str:
    return (f"C++ op cache {what} {path} {problem}: meta loads no library another user could "
            "have written; set META_CACHE_DIR to a folder of your own (made with mode 0700)")


def test_a_library_others_may_write_or_a_link_is_refused_in_one_line(cache: Path,
                                                                     tmp_path: Path) -> None:
    library = cpp_ops.build(SWISH)
    library.chmod(0o666)
    with pytest.raises(UnsafeCacheError) as refused:
        cpp_ops.build(SWISH)
    assert str(refused.value) == _refused("library", library,
                                          "is writable by other users (mode 666)")
    planted = tmp_path / "planted.so"
    planted.write_text("another's code")
    library.unlink()
    library.symlink_to(planted)
    with pytest.raises(UnsafeCacheError, match="is a symbolic link"):
        cpp_ops.build(SWISH)


def test_a_build_folder_others_may_write_or_a_link_is_refused(cache: Path,
                                                              tmp_path: Path) -> None:
    folder = cpp_ops.build(SWISH).parent
    folder.chmod(0o777)
    with pytest.raises(UnsafeCacheError) as refused:
        cpp_ops.build(SWISH)
    assert str(refused.value) == _refused("folder", folder,
                                          "is writable by other users (mode 777)")
    shutil.rmtree(folder)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    folder.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeCacheError, match="is a symbolic link"):
        cpp_ops.build(SWISH)


def test_a_shared_cache_folder_is_refused(cache: Path) -> None:
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)  # META_CACHE_DIR open to all, not sticky: cpp_ops could be swapped
    with pytest.raises(UnsafeCacheError) as refused:
        cpp_ops.build(SWISH)
    assert str(refused.value) == _refused("folder", cache, "is writable by other users "
                                          "(mode 777)")
    cache.chmod(0o1777)  # as /tmp: sticky, no one renames another's cpp_ops
    assert cpp_ops.build(SWISH).is_file()
    (cache / "cpp_ops").chmod(0o775)
    with pytest.raises(UnsafeCacheError, match="writable by other users"):
        cpp_ops.build(SWISH)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_cache_folder_or_library_is_refused(cache: Path) -> None:
    library = cpp_ops.build(SWISH)
    os.chown(library, OTHER, OTHER)
    with pytest.raises(UnsafeCacheError) as refused:
        cpp_ops.build(SWISH)
    assert str(refused.value) == _refused(
        "library", library, f"belongs to uid {OTHER}, not to this user (uid 0)")
    os.chown(library, 0, 0)
    os.chown(cache / "cpp_ops", OTHER, OTHER)
    with pytest.raises(UnsafeCacheError, match=f"folder {cache / 'cpp_ops'} belongs to uid"):
        cpp_ops.build(SWISH)
