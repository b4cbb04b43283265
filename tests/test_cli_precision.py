"""The command line's precision flags (issue 42): ``meta --version`` says whether bf16 is
native here, ``meta inspect --plan --precision bf16`` lists each node's precision, ``meta
bench-op --precision`` runs the planned executor in bf16."""

from __future__ import annotations

import json

import pytest

from meta.cli import EXIT_ERROR, EXIT_PASS, main
from meta.lv1.plan import precision


def version_lines(capsys) -> list[str]:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    return capsys.readouterr().out.strip().splitlines()


def test_version_says_whether_bf16_is_native_and_what_bf16_runs_as(capsys, monkeypatch):
    monkeypatch.delenv(precision.SIMULATE_ENV, raising=False)
    here = version_lines(capsys)
    assert len(here) == 2 and here[0].startswith("meta ") and here[1].startswith("bf16: ")
    native, why = precision.native_bf16()
    if native:
        assert "native on this CPU (avx512_bf16" in here[1] or "(amx_bf16" in here[1]
        assert "precision=bf16 runs matrix products and convolutions in bf16" in here[1]
    else:
        assert here[1] == f"bf16: not native here ({why}): precision=bf16 runs float32"
    monkeypatch.setenv(precision.SIMULATE_ENV, "1")
    simulated = version_lines(capsys)
    assert simulated[1] == ("bf16: not native here (META_NO_NATIVE_BF16 is set): "
                            "precision=bf16 runs float32")
    assert simulated[1] != here[1]


@pytest.fixture
def mlp_file(tmp_path):
    from meta.lv1 import mlp, save_onnx

    path = tmp_path / "mlp.onnx"
    save_onnx(mlp(hidden=[16], seed=0), path)
    return path


def plan_rows(out: str) -> dict[str, list[str]]:
    """inspect --plan's node rows: node -> its columns after the name."""
    rows = out.split(" node ", 1)[1].splitlines()[1:]
    return {r.split()[0]: r.split()[1:] for r in rows if r.startswith("  ") and
            not r.startswith("  (")}


def test_inspect_plan_lists_each_nodes_precision(mlp_file, capsys, monkeypatch):
    monkeypatch.delenv(precision.SIMULATE_ENV, raising=False)
    if not precision.native_bf16()[0]:
        pytest.skip("bf16 is not native here")
    assert main(["inspect", str(mlp_file), "--plan", "--precision", "bf16",
                 "--dim", "N=4"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "precision bf16: matrix products and convolutions read bf16" in out
    rows = plan_rows(out)
    assert rows["fc0"][:4] == ["Gemm", "onednn", "bf16", "bf16"], rows
    assert rows["loss"][2] == "f32", rows  # the loss stays float32
    assert rows["flatten"][:2] == ["Flatten", "view"] and len(rows["flatten"]) == 2  # no own
    assert main(["inspect", str(mlp_file), "--plan", "--dim", "N=4"]) == EXIT_PASS
    f32 = plan_rows(capsys.readouterr().out)
    assert f32["fc0"][:3] == ["Gemm", "onednn", "f32"], f32


def test_inspect_plan_says_when_bf16_runs_float32(mlp_file, capsys, monkeypatch):
    monkeypatch.setenv(precision.SIMULATE_ENV, "1")
    assert main(["inspect", str(mlp_file), "--plan", "--precision", "bf16",
                 "--dim", "N=4"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert ("precision bf16 asked for; this plan runs f32 (every node float32): bf16 is not "
            "native here (META_NO_NATIVE_BF16 is set)") in out
    assert plan_rows(out)["fc0"][:3] == ["Gemm", "onednn", "f32"]


def test_inspect_precision_without_plan_is_one_line(mlp_file, capsys):
    assert main(["inspect", str(mlp_file), "--precision", "bf16"]) == EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err == "meta: error: inspect --precision bf16 says what a plan computes in: give " \
                  "--plan too", err


def test_bench_op_runs_the_planned_executor_in_bf16(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(precision.SIMULATE_ENV, raising=False)
    if not precision.native_bf16()[0]:
        pytest.skip("bf16 is not native here")
    out = tmp_path / "op"
    code = main(["bench-op", "MatMul", "--shape", "16,32", "--shape", "32,8", "--precision",
                 "f32,bf16", "--repeat", "2", "--warmup", "0", "--no-frameworks",
                 "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["precision"] == ["f32", "bf16"]
    assert [v["name"] for v in report["variants"]][:4] == [
        "numpy forward", "native forward", "planned forward", "planned bf16 forward"]
    # float32's planned MatMul equals numpy's; bf16's differs by bf16's rounding
    diff = report["max_abs_diff"]["forward"]
    assert diff["planned"] < 1e-4 < diff["planned bf16"] < 0.5, diff
    assert "(node runs as onednn bf16)" in printed
    assert "planned bf16: MatMul ran as onednn bf16: its products read bf16" in printed


def test_bench_op_bf16_of_an_op_without_products_says_it_ran_float32(tmp_path, capsys):
    code = main(["bench-op", "Relu", "--shape", "8,16", "--precision", "bf16", "--backend",
                 "numpy", "--repeat", "2", "--warmup", "0", "--no-frameworks",
                 "--output-dir", str(tmp_path / "op")])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    assert "planned bf16: Relu ran as onednn, in float32" in printed


def test_bench_op_refuses_an_unknown_precision(capsys):
    assert main(["bench-op", "Relu", "--precision", "fp8", "--no-frameworks"]) == EXIT_ERROR
    assert capsys.readouterr().err.strip() == \
        "meta: error: --precision fp8: expected one or more of f32, bf16"
