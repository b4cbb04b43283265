"""ResNet-20 trained data-parallel on 2 ranks: running statistics move, are averaged across the
replicas instead of riding in every step's allreduce, and the exported model evaluated by
onnxruntime scores what meta's eval mode scored."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from meta.lv2 import synthetic

META = str(Path(sys.executable).parent / "meta")

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

RECIPE = """
from meta.run.recipe import AtLeast
FIXED = {"dataset": "synthetic", "model": "resnet20", "optimizer": "sgd", "train_samples": 1536,
         "batch_size": 32, "eval_batch_size": 500, "weight_decay": 0.0005}
MUTABLE = {"epochs": 2, "lr": 0.05, "seed": 0}
METRICS = {"test_accuracy": AtLeast(0.5)}
"""


def test_resnet20_state_under_allreduce(tmp_path, mpirun):
    recipe = tmp_path / "resnet_state.py"
    recipe.write_text(RECIPE)
    out = tmp_path / "run"
    output = mpirun(2, [META, "run", str(recipe), "--output-dir", str(out), "--quiet"],
                    timeout=400)
    assert "resnet_state: PASS" in output, output
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]

    model = onnx.load(str(out / "model.onnx"))
    arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    state = {k: v for k, v in arrays.items() if "running_" in k}
    params = {k: v for k, v in arrays.items() if k not in state}
    assert len(state) == 42 and len(params) == 65
    # The statistics moved away from their initial (0, 1) and were exported with the model.
    assert np.abs(state["bn0.running_mean"]).max() > 1e-3
    assert not np.allclose(state["s3b3.bn2.running_var"], 1.0)
    # Each step's allreduce carries the parameters' gradients only; the state is averaged at
    # each evaluation (2 epochs: 2 evaluations), its bytes counted apart.
    param_bytes = sum(v.nbytes for v in params.values())
    state_bytes = sum(v.nbytes for v in state.values())
    assert metrics["bytes_sent_per_step"] == param_bytes
    assert metrics["state_bytes_sent"] == 2 * state_bytes
    printed = re.search(r"\((\d+) bytes sent per step; state, (\d+) bytes", output)
    assert printed and int(printed[1]) == param_bytes and int(printed[2]) == state_bytes, output
    print(f"allreduce payload per step: {param_bytes} bytes (with the state it would be "
          f"{param_bytes + state_bytes})")
    for node in model.graph.node:  # written for inference
        if node.op_type == "BatchNormalization":
            assert len(node.output) == 1

    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is an optional extra")
    test = synthetic(2000, (1, 28, 28), 10, seed=0, split=1)  # the recipe's test split
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = np.concatenate([session.run(["logits"], {"input": test.inputs[i:i + 500]})[0]
                             for i in range(0, 2000, 500)])
    ort_accuracy = float(np.mean(logits.argmax(1) == test.labels))
    assert abs(ort_accuracy - metrics["test_accuracy"]) <= 1 / 2000, (ort_accuracy, metrics)
