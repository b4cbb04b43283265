"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from meta.lv0 import registry

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path))  # the C++ example compiles here
    with registry.scratch():  # the example registers "Swish": keep the real registry clean
        run_examples()


def run_examples():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["report"].passed
    assert np.isfinite(namespace["values"]["loss"])
