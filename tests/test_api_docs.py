"""The API reference builds from the docstrings without a warning (CI builds it too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_api_reference_builds_without_warnings(tmp_path: Path) -> None:
    """About a minute: pdoc imports and renders every public module."""
    pytest.importorskip("pdoc", reason="pdoc is not installed (pip install -e '.[docs]')")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "build_api_docs.py"),
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    pages = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.html")}
    for page in ("meta.html", "meta/lv0.html", "meta/lv1.html", "meta/lv2.html",
                 "meta/lv3.html", "meta/ops/relu.html"):
        assert page in pages, f"{page} missing from the reference ({len(pages)} pages)"
    lv1 = (tmp_path / "meta" / "lv1.html").read_text()
    assert "PlannedExecutor" in lv1 and "Runs a graph as a compiled plan" in lv1


def test_public_modules_skip_private_and_excluded() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import build_api_docs
    finally:
        sys.path.remove(str(ROOT / "tools"))
    names = build_api_docs.public_modules()
    assert names[0] == "meta" and "meta.lv1.executor" in names and "meta.ops.relu" in names
    assert not [n for n in names if "._" in n]
    assert "meta.lv1.torch_ops" not in names
