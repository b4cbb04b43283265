"""The benchmark scripts run and print their figures (tiny settings: the numbers mean nothing)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_train_step_prints_throughput_ratios():
    out = run("train_step.py", "--models", "mlp,lenet5", "--steps", "1", "--repeats", "1",
              "--warmup", "0", "--threads", "1")
    for model in ("mlp", "lenet5"):  # against PyTorch where it is installed, else native
        assert re.search(rf"{model}\s+1 thread\(s\): .*planned/(pytorch|native) \d+\.\d\d",
                         out), out
    assert "meta native" in out and "meta planned" in out and "samples/s" in out


@pytest.mark.slow
def test_train_step_memory_mode_prints_peaks():
    out = run("train_step.py", "--memory", "--models", "lenet5", "--memory-steps", "1")
    assert "step peak adds MiB" in out and "meta native" in out and "meta planned" in out, out


@pytest.mark.slow
def test_cross_framework_prints_ratios_writes_and_merges(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'meta[torch]')")
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    first, second = tmp_path / "step.json", tmp_path / "inference.json"
    out = run("cross_framework.py", "--parts", "step", "--threads", "1", "--steps", "1",
              "--repeats", "2", "--warmup", "0", "--no-cuda", "--json", str(first))
    assert re.search(r"meta native\s+\d+\.\d\d ms  x\d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\] vs "
                     r"pytorch eager", out), out
    assert "meta on pytorch executor" in out
    run("cross_framework.py", "--parts", "inference", "--threads", "1", "--steps", "1",
        "--repeats", "2", "--warmup", "0", "--json", str(second))
    out = run("cross_framework.py", "--merge", str(first), str(second), "--plot",
              str(tmp_path / "report.png"))
    assert "inference, exported LeNet-5, batch 64: meta native" in out, out
    assert (tmp_path / "report.png").stat().st_size > 0


@pytest.mark.slow
def test_inference_compares_the_planned_executor_with_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    path = tmp_path / "inference.json"
    out = run("inference.py", "--models", "squeezenet", "--repeats", "1", "--calls", "1",
              "--warmup", "0", "--json", str(path))
    assert re.search(r"squeezenet\s+batch  1, 1 thread\(s\): meta planned \d+\.\d\d ms.*"
                     r"meta/onnxruntime \d+\.\d\d \[", out), out
    assert path.exists()


@pytest.mark.slow
def test_inference_runs_the_planned_executor_in_bf16_beside_float32(tmp_path):
    """--precision f32,bf16: meta bf16's line with its time over meta float32's and its
    difference from float32; the JSON says what it ran as (float32 where bf16 is not
    native)."""
    import json

    path = tmp_path / "inference.json"
    out = run("inference.py", "--models", "squeezenet", "--repeats", "1", "--calls", "1",
              "--warmup", "0", "--precision", "f32,bf16", "--json", str(path))
    assert re.search(r"squeezenet\s+batch  1, 1 thread\(s\): meta planned \d+\.\d\d ms, meta "
                     r"planned bf16 \d+\.\d\d ms", out), out
    assert re.search(r"bf16.*: \d+\.\d\d ms; time bf16/meta f32 \d+\.\d\d \[.*max \|bf16 - ",
                     out), out
    bf16 = json.loads(path.read_text())["results"][0]["bf16"]
    if bf16["runs_as"] == "bf16":  # bf16's rounding, not float32's
        assert 1e-5 < bf16["max_abs_difference"] < 0.1, bf16
    else:
        assert bf16["runs_as"] == "f32" and bf16["max_abs_difference"] < 1e-4, bf16
    assert ("onednn bf16" in bf16["placement"]) == (bf16["runs_as"] == "bf16")


@pytest.mark.slow
@pytest.mark.mpi
def test_data_parallel_prints_efficiency_and_the_cost_model(mpirun, tmp_path):
    out = mpirun(2, [sys.executable, str(BENCHMARKS / "data_parallel.py"), "--models", "mlp",
                     "--steps", "2", "--repeats", "1", "--warmup", "1",
                     "--json", str(tmp_path / "dp.json")])
    assert re.search(r"mlp at 2 ranks \(planned\): .* allreduce through shared memory .* "
                     r"efficiency \d+\.\d\d .* through MPI.s allreduce, overlap on: .* "
                     r"efficiency \d+\.\d\d", out), out
    assert re.search(r"transfer measured \d+\.\d+ ms, α-β predicted \d+\.\d+ ms", out), out


@pytest.mark.slow
def test_time_to_accuracy_against_pytorch(mnist_dir):
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'meta[torch]')")
    out = run("time_to_accuracy.py", "--threads", "1", "--runs", "1", "--target", "0.5")
    assert re.search(r"median time to 50%: meta planned \d+\.\d\d s, meta native \d+\.\d\d s, "
                     r"pytorch \d+\.\d\d s; pytorch / meta planned \d+\.\d\d", out), out



@pytest.mark.slow
@pytest.mark.mpi
def test_model_parallel_prints_ratios_predictions_and_equality(mpirun, tinyshakespeare_dir,
                                                                tmp_path):
    if tinyshakespeare_dir is None:
        pytest.skip("no Tiny Shakespeare (set $META_TINYSHAKESPEARE_DIR)")
    out = mpirun(2, [sys.executable, str(BENCHMARKS / "model_parallel.py"), "--steps", "1",
                     "--repeats", "1", "--calibration-steps", "1",
                     "--json", str(tmp_path / "mp.json")], timeout=300)
    for name in ("tensor_parallel", "pipeline"):  # float32, planned: within 1e-5
        assert re.search(rf"{name}: largest difference from one process: .* bound 1e-05: met",
                         out), out
    assert re.search(r"tensor parallel, 2 ranks\s+\d+\.\d\s+\d\.\d{3}\s+0\.65\s+\d+\.\d", out), out
    assert re.search(r"pipeline 2 x 4 micro-batches \(1f1b\)\s+\d+\.\d\s+\d\.\d{3}\s+0\.75", out)
    assert "load average" in out and "CPU " in out, out
    figures = json.loads((tmp_path / "mp.json").read_text())
    assert set(figures["ratio"]) == {"single", "tensor_parallel", "pipeline"}, figures
    assert all(v > 0 for v in figures["predicted_ms"].values()), figures
