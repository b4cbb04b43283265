"""The convolutional main job end to end: LeNet-5 on MNIST reaches its accuracy bound."""

from __future__ import annotations

import pytest

from meta.lv2 import mnist

from .recipe_checks import assert_export_predicts_like_meta, run_shipped_recipe

pytestmark = pytest.mark.slow


def test_lenet_recipe_passes_and_its_onnx_export_predicts_the_same(tmp_path, mnist_dir):
    report = run_shipped_recipe("mnist_lenet", tmp_path)
    assert report["metrics"]["test_accuracy"] >= 0.988
    # onnx.reference pools in Python loops: a few hundred images are plenty
    assert_export_predicts_like_meta(tmp_path, mnist("test"), images=200)
