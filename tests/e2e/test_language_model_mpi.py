"""The Shakespeare GPT under mpiexec with every distributed strategy, each shortened to a few
hundred blocks (validation on 2 % of the blocks) and held to a bound a short correct run
reaches with margin: data-parallel (allreduce, 2 ranks), 2 pipeline stages, tensor
parallelism over 2 ranks and Downpour (a server and two workers).

The bound is in nats per character on the validation blocks. Predicting each character from
its corpus frequency alone (the unigram entropy of Tiny Shakespeare) gives 3.31, and the
uniform guess over the 65 characters ln 65 = 4.17; a model conditioned on the previous
character (the bigram entropy) 2.45. A run at or under 2.9 has learned from context; a run
that does not train, or trains on wrong gradients, stays near 3.3 or above. Downpour is held
to 3.1: its asynchronous workers learn more slowly and less evenly (2.73 and 2.96 in two runs
of this test's configuration; the train loss of the second epoch, the two workers', rose above
the first's, mostly worker 0's warm start). Exactness is checked apart:
tests/lv3/tensor_parallel/test_gpt_parallel.py compares the pipelined and the partitioned GPT's gradients with one process's.
"""

from __future__ import annotations

import re

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
pytestmark = [pytest.mark.slow, pytest.mark.mpi]

BOUND = 2.9  # nats per character: see the module's docstring
DOWNPOUR_BOUND = 3.1


def _short(module: str, train_samples: int, epochs: int, bound: float = BOUND) -> str:
    """``recipes/<module>.py`` on the first ``train_samples`` blocks for ``epochs``, validated
    on 2 % of the blocks, held to ``bound``."""
    return (f"from meta.run.recipe import AtMost\n"
            f"from recipes.{module} import FIXED, MUTABLE\n\n"
            f"MUTABLE = {{**MUTABLE, 'dataset.train_samples': {train_samples}, "
            f"'epochs': {epochs}, 'dataset.validation': 0.02}}\n"
            f"METRICS = {{'test_loss': AtMost({bound})}}\n")


def _run(tmp_path: Path, mpirun, ranks: int, text: str, name: str) -> tuple[str, list]:
    recipe = tmp_path / f"{name}.py"
    recipe.write_text(text)
    output = mpirun(ranks, [META, "run", str(recipe), "--output-dir", str(tmp_path / "o"),
                            "--quiet", "--no-export"], env={"PYTHONPATH": str(REPO)},
                    timeout=900)
    assert output.count(f"{name}: PASS") == 1, output
    assert output.count(f"on {ranks} ranks") == 1, output
    return output, json.loads((tmp_path / "o" / "metrics.json").read_text())["history"]


@pytest.fixture
def shakespeare(tinyshakespeare_dir):
    if tinyshakespeare_dir is None:
        pytest.skip("no Tiny Shakespeare in ../shared/datasets (nor $META_TINYSHAKESPEARE_DIR)")
    return tinyshakespeare_dir


def test_the_gpt_under_allreduce_on_2_ranks(tmp_path, shakespeare, mpirun):
    """40 steps of 2 x 32 blocks (the default strategy under mpiexec)."""
    output, history = _run(tmp_path, mpirun, 2, _short("shakespeare_gpt", 1280, 2),
                           "gpt_allreduce_short")
    assert output.count("--- sample after epoch 2 ---") == 1, output  # the root's only
    assert history[-1]["train_loss"] < history[0]["train_loss"], history
    assert history[-1]["test_loss"] <= BOUND, history


def test_the_gpt_over_2_pipeline_stages(tmp_path, shakespeare, mpirun):
    """Blocks cut between the stages, 4 micro-batches, the tied embedding held by both stages
    (its gradients summed); a sample generated through the pipeline."""
    output, history = _run(tmp_path, mpirun, 2, _short("shakespeare_gpt_pipeline", 1280, 1),
                           "gpt_pipeline_short")
    assert "meta: pipeline of 2 stages (cuts: cuts after ['h0.mlp.residual'])" in output, output
    assert output.count("--- sample after epoch 1 ---") == 1, output  # rank 0 prints
    assert history[-1]["test_loss"] <= BOUND, history


def test_the_gpt_with_tensor_parallel_blocks(tmp_path, shakespeare, mpirun):
    """Megatron's split: 8 column-parallel and 4 row-parallel layers in 2 blocks; with
    sequence parallelism (the default) 4 all-gathers and 4 reduce-scatters forward, as many
    backward, and one allreduce of the replicated parameters' gradients with the loss."""
    output, history = _run(tmp_path, mpirun, 2,
                           _short("shakespeare_gpt_tensor_parallel", 1280, 1),
                           "gpt_tensor_parallel_short")
    assert "partitioned over 2 ranks: 8 column-parallel, 4 row-parallel" in output, output
    collectives = re.findall(r"^  (\S+) +(forward|backward) ", output, re.MULTILINE)
    for kind in ("all-gather", "reduce-scatter"):  # 4 a step each way
        for phase in ("forward", "backward"):
            assert collectives.count((kind, phase)) == 4, output
    assert collectives.count(("allreduce", "backward")) == 1, output
    assert len(collectives) == 17, output
    assert output.count("--- sample after epoch 1 ---") == 1, output  # rank 0 prints
    assert history[-1]["test_loss"] <= BOUND, history


def test_the_gpt_under_downpour_with_a_server_and_2_workers(tmp_path, shakespeare, mpirun):
    """120 steps a worker (worker 0's first 20 alone); the bound holds the server's final
    parameters, which the runner evaluates after the workers' last pushes. The loss varies
    with the order the pushes arrive in: at 2 epochs 2.70-2.96 in six runs and once above
    3.1; at 3 epochs 2.73-2.93 in four, so 3 for margin."""
    output, history = _run(tmp_path, mpirun, 3,
                           _short("shakespeare_gpt_downpour", 2560, 3, DOWNPOUR_BOUND),
                           "gpt_downpour_short")
    assert "staleness of applied pushes" in output, output
    assert output.count("--- sample after epoch 3 ---") == 1, output  # worker 0's only
    # not the train loss: epoch 1 is mostly worker 0's warm start, and it rose in epoch 2
    assert history[-1]["test_loss"] <= DOWNPOUR_BOUND, history
