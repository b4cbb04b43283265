"""An LSTM reading MNIST rows as a sequence reaches the recipe's 97 %."""

from __future__ import annotations

import pytest

from .recipe_checks import run_shipped_recipe

pytestmark = pytest.mark.slow


def test_lstm_recipe_passes(tmp_path, mnist_dir):
    report = run_shipped_recipe("mnist_lstm", tmp_path, timeout=900)
    assert report["definitions"]["model"] == "lstm"
    assert report["metrics"]["test_accuracy"] >= 0.97
