"""Issue 21's recipes end to end at ``mpiexec -n 2``, short runs of ``meta compare`` on MNIST:
quantized allreduce reaches the bound uncompressed allreduce reaches, with the bytes per step
its packing promises; batch growth reaches step decay's accuracy in fewer steps."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
META = str(Path(sys.executable).parent / "meta")
MLP_PARAMETERS = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
SCALES = 4 * -(-MLP_PARAMETERS // 512)  # one float32 scale per bucket of 512

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def compare(mpirun, out: Path, recipe: str, sets: list[str], variants: list[str]) -> dict:
    """One ``meta compare`` run of each variant at -n 2; {variant: its run's report}."""
    args = [META, "compare", str(REPO / "recipes" / f"{recipe}.py"), "--repeat", "1",
            "--no-plots", "--output-dir", str(out), *(f"--set={s}" for s in sets),
            *(f"--variant={v}" for v in variants)]
    mpirun(2, args, timeout=300)
    report = json.loads((out / "report.json").read_text())
    return {v["name"]: v["runs"][0] for v in report["variants"]}


def test_quantized_allreduce_reaches_allreduces_bound(tmp_path, mnist_dir, mpirun):
    """12,000 examples, 2 epochs: allreduce 94.4 %, 4-bit QSGD 94.5 %, TernGrad 93.2 %."""
    runs = compare(mpirun, tmp_path, "mnist_quantized", ["train_samples=12000", "epochs=2"],
                   ["compression=none", "compression=qsgd", "compression=terngrad"])
    bound = 0.92
    for name, run in runs.items():
        assert run["metrics"]["test_accuracy"] >= bound, (name, run["metrics"])
    sent = {name: run["metrics"]["bytes_sent_per_step"] for name, run in runs.items()}
    assert sent == {"compression=none": 4 * MLP_PARAMETERS,
                    "compression=qsgd": SCALES + -(-MLP_PARAMETERS * 4 // 8),
                    "compression=terngrad": SCALES + -(-MLP_PARAMETERS // 5)}


def test_batch_growth_matches_step_decay_in_fewer_steps(tmp_path, mnist_dir, mpirun):
    """12,000 examples (6,000 per rank), 3 epochs, 64 per rank at first: step decay takes
    94 steps an epoch; growing 5x after epochs 1 and 2 takes 94 + 19 + 4."""
    step_decay, growth = "lr_schedule=step,events.batch_growth.factor=1", "lr_schedule=constant"
    runs = compare(mpirun, tmp_path, "mnist_batch_growth",
                   ["train_samples=12000", "epochs=3", "lr_decay_epochs=1,2",
                    "events.batch_growth.epochs=1,2"], [step_decay, growth])
    decayed, grown = runs[step_decay]["metrics"], runs[growth]["metrics"]
    assert (decayed["steps"], decayed["batch_size"]) == (3 * 94, 64)
    assert (grown["steps"], grown["batch_size"]) == (94 + 19 + 4, 64 * 25)
    assert len(runs[growth]["step_time_s"]) == 94 + 19 + 4
    assert decayed["test_accuracy"] >= 0.94 and grown["test_accuracy"] >= 0.94, runs
    assert abs(grown["test_accuracy"] - decayed["test_accuracy"]) <= 0.01, (grown, decayed)
