"""The README's Python examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from meta.lv0 import registry
from meta.lv1 import MODELS
from meta.lv2.optimizers import OPTIMIZERS

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_examples_run(tmp_path, monkeypatch):
    monkeypatch.setenv("META_CACHE_DIR", str(tmp_path))  # the C++ example compiles here
    saved, models = dict(OPTIMIZERS.entries), dict(MODELS.entries)
    try:  # the examples register "Swish", "signum", "small_cnn": keep the registries clean
        with registry.scratch():
            run_examples()
    finally:
        OPTIMIZERS.entries.clear()
        OPTIMIZERS.entries.update(saved)
        MODELS.entries.clear()
        MODELS.entries.update(models)


def run_examples():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["report"].passed
    assert np.isfinite(namespace["values"]["loss"])
