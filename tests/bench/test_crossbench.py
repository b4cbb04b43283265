"""``meta bench-op`` across meta's backends and the frameworks installed (tiny shapes)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from meta.bench import crossbench
from meta.bench.opbench import DEFAULT_INPUTS, twins
from meta.cli import EXIT_ERROR, EXIT_PASS, main

CONV = ["--shape", "1,2,6,6", "--shape", "3,2,3,3", "--attr", "pads=1,1,1,1"]


def _installed(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def test_bench_op_conv_prints_meta_and_the_frameworks_side_by_side(tmp_path, capsys):
    out = tmp_path / "op"
    code = main(["bench-op", "Conv", *CONV, "--repeat", "2", "--warmup", "0",
                 "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    assert "Conv forward (1x2x6x6, 3x2x3x3; pads=[1, 1, 1, 1]) across" in printed
    rows = {r["name"]: r for r in json.loads((out / "report.json").read_text())["across"]["rows"]}
    assert list(rows) == list(crossbench.IMPLEMENTATIONS)
    for name in ("reference", "native", "planned"):
        assert rows[name]["time_s"]["n"] == 2 and rows[name]["max_abs_diff"] < 1e-4, name
        assert f"\n{name} " in printed
    assert rows["planned"]["note"].startswith("plan step: ")
    for name, module in (("pytorch", "torch"), ("onnxruntime", "onnxruntime")):
        if _installed(module):
            assert rows[name]["max_abs_diff"] < 1e-4, rows[name]
            assert f"\n{name} " in printed
        else:
            assert f"{name}: not installed" in printed


def test_a_framework_not_installed_is_one_line_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    result = crossbench.compare("Relu", twins("Relu"), [x], repeat=1, warmup=0)
    rows = {r.name: r for r in result.rows}
    assert rows["pytorch"].sample is None and rows["pytorch"].note == "not installed"
    assert rows["onnxruntime"].note == "not installed"
    text = crossbench.table(result)
    assert "pytorch: not installed" in text and "onnxruntime: not installed" in text
    assert rows["native"].max_abs_diff == 0.0


def test_disagreeing_implementations_show_their_difference(monkeypatch):
    """The max |diff| column is the real difference: a wrong twin is visible."""
    classes = dict(twins("Relu"))

    class WrongRelu(classes["native"]):
        def forward(self, ctx, x):
            return super().forward(ctx, x) + 0.5

    classes["native"] = WrongRelu
    x = np.ones((3, 3), np.float32)
    result = crossbench.compare("Relu", classes, [x], repeat=1, warmup=0,
                                implementations=("reference", "native"))
    assert [r.name for r in result.rows] == ["reference", "native"]
    assert result.rows[1].max_abs_diff == pytest.approx(0.5)


def test_defaults_cover_the_documented_ops_and_others_of_several_inputs_ask_for_shape(
        capsys):
    for op in ("Conv", "Gemm", "MatMul", "Relu", "Softmax", "MaxPool", "BatchNormalization"):
        assert op in DEFAULT_INPUTS
    assert main(["bench-op", "Concat"]) == EXIT_ERROR  # of several inputs: no default
    err = capsys.readouterr().err
    assert "bench-op Concat needs --shape" in err and "any op of one input (64x4096)" in err


def test_help_documents_the_default_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["bench-op", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Conv 8,16,32,32 32,16,3,3 32" in text and "onnxruntime" in text
