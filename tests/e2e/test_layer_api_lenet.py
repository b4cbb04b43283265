"""A LeNet-5 written in a few lines of the layer API trains to the LeNet recipe's accuracy,
with that recipe's own settings (only its model replaced), through ``meta run``.

The recipe's wall-clock bound, if it still has one, is left out: on a busy machine it fails
correct runs (issue 31, item 5), and what is checked here is the accuracy."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.launch import clean_env, run_command

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
# The model in 5 lines (the acceptance asks for at most 8), PyTorch's default initialisation.
MODEL = '''
from meta.lv1.layers import Conv, Flatten, Linear, MaxPool, Relu, Sequential


def lenet_layers(input_shape, classes, seed, dtype):
    return Sequential(Conv(6, 5, padding=2), Relu(), MaxPool(2), Conv(16, 5), Relu(), MaxPool(2),
                      Flatten(), Linear(120), Relu(), Linear(84), Relu(), Linear(classes),
                      ).graph(input_shape, classes, seed=seed, dtype=dtype)

'''

pytestmark = pytest.mark.slow


def test_a_layer_api_lenet_meets_the_lenet_recipes_bound(tmp_path, mnist_dir):
    shipped = (REPO / "recipes" / "mnist_lenet.py").read_text()
    assert '"model": "lenet",' in shipped
    head, _, rest = shipped.partition("FIXED = {")
    recipe = tmp_path / "lenet_layers.py"
    rest = rest.replace('"model": "lenet",', '"model": lenet_layers,')
    rest = re.sub(r'\n\s*"train_time_s": AtMost\([^)]*\),', "", rest)
    recipe.write_text(head + MODEL + "\nFIXED = {" + rest)
    out = tmp_path / "run"
    printed = run_command([META, "run", str(recipe), "--output-dir", str(out), "--quiet"],
                          clean_env(), timeout=1800)
    assert "lenet_layers: PASS" in printed, printed
    report = json.loads((out / "metrics.json").read_text())
    assert report["metrics"]["test_accuracy"] >= 0.988
