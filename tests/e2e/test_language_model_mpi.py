"""The Shakespeare GPT data-parallel under mpiexec (the allreduce strategy, 2 ranks), shortened
to a few hundred blocks and a looser bound: token ids and per-token targets through the
distributed sampler, the summed per-token metrics and the root-only sample."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
pytestmark = [pytest.mark.slow, pytest.mark.mpi]

SHORT = '''
from meta.recipe import AtMost
from recipes.shakespeare_gpt import FIXED, MUTABLE

FIXED = {**FIXED, "distributed": "allreduce"}
MUTABLE = {**MUTABLE, "dataset.train_samples": 1280, "epochs": 2}
METRICS = {"test_loss": AtMost(3.0)}  # the full recipe's is 2.1, after 490 steps
'''


def test_the_gpt_under_allreduce_on_2_ranks(tmp_path, tinyshakespeare_dir, mpirun):
    if tinyshakespeare_dir is None:
        pytest.skip("no Tiny Shakespeare in ../shared/datasets (nor $META_TINYSHAKESPEARE_DIR)")
    recipe = tmp_path / "shakespeare_gpt_short.py"
    recipe.write_text(SHORT)
    output = mpirun(2, [META, "run", str(recipe), "--output-dir", str(tmp_path / "o"),
                        "--quiet", "--no-export"], env={"PYTHONPATH": str(REPO)}, timeout=900)
    assert output.count("shakespeare_gpt_short: PASS") == 1, output
    assert output.count("on 2 ranks") == 1, output
    assert output.count("--- sample after epoch 2 ---") == 1, output  # the root's only
    history = json.loads((tmp_path / "o" / "metrics.json").read_text())["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"], history
