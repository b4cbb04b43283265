"""Fashion-MNIST end to end: LeNet-5 with augmentation reaches the recipe's 89 %."""

from __future__ import annotations

import pytest

from meta.lv2 import fashion_mnist

from .recipe_checks import assert_export_predicts_like_meta, run_shipped_recipe

pytestmark = pytest.mark.slow


def test_fashion_lenet_recipe_passes(tmp_path, fashion_mnist_dir):
    report = run_shipped_recipe("fashion_lenet", tmp_path)
    assert report["metrics"]["test_accuracy"] >= 0.89
    assert_export_predicts_like_meta(tmp_path, fashion_mnist("test"), images=200)
