"""``meta compare``, ``meta run --repeat`` and ``meta bench-op`` end to end on tiny inputs."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from meta.cli import EXIT_ERROR, EXIT_PASS, main

TINY = """
    from meta.run.recipe import AtLeast, AtMost
    FIXED = {{"dataset": "mnist", "hidden": [16]}}
    MUTABLE = {{"epochs": 1, "train_samples": 500, "batch_size": 64, "lr": {lr},
               "executor": "reference", "seed": 0}}
    METRICS = {{"test_accuracy": AtLeast(0.3), "train_time_s": AtMost(60)}}
"""
PNG = b"\x89PNG\r\n\x1a\n"
STEPS_PER_RUN = 8  # 500 samples in batches of 64


def tiny(tmp_path, name="tiny", lr=0.05):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(TINY.format(lr=lr)))
    return str(path)


def assert_png(path):
    assert path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def check_recipe_report(report, kind, names, repeat):
    assert report["schema"] == "meta.bench/1" and report["kind"] == kind
    assert report["settings"]["repeat"] == repeat and report["settings"]["resamples"] == 2000
    assert report["environment"]["recipes"] and report["environment"]["numpy"]["version"]
    assert [v["name"] for v in report["variants"]] == names
    for v in report["variants"]:
        assert len(v["runs"]) == repeat
        assert all(len(r["step_time_s"]) == STEPS_PER_RUN for r in v["runs"])
        assert all(len(r["step_loss"]) == STEPS_PER_RUN and r["epochs"] for r in v["runs"])
        step = v["step_time_s"]
        assert step["n"] == repeat * (STEPS_PER_RUN - 3)  # the first 3 of each run skipped
        assert step["ci_low"] <= step["median"] <= step["ci_high"]
        assert 0.3 <= v["final_metrics"]["test_accuracy"] <= 1


def test_compare_two_set_variants_writes_json_and_plots(tmp_path, mnist_dir, capsys):
    out = tmp_path / "out"
    code = main(["compare", tiny(tmp_path), "--a", "executor=reference", "--b",
                 "executor=native", "--repeat", "2", "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    check_recipe_report(report, "compare", ["executor=reference", "executor=native"], 2)
    (cmp,) = report["comparisons"]
    assert cmp["baseline"] == "executor=reference" and cmp["candidate"] == "executor=native"
    assert cmp["ci_low"] <= cmp["ratio"] <= cmp["ci_high"]
    # Same seed, and the native kernels match numpy to rounding: the same training either way.
    a, b = (v["runs"][0]["step_loss"] for v in report["variants"])
    np.testing.assert_allclose(a, b, rtol=1e-4)
    assert_png(out / "step_times.png")
    assert_png(out / "loss_curves.png")
    assert "median step time executor=native / executor=reference" in printed
    assert "95% CI" in printed and "test_accuracy" in printed


def test_compare_two_recipe_files(tmp_path, mnist_dir, capsys):
    a, b = tiny(tmp_path, "slow_lr", lr=0.01), tiny(tmp_path, "fast_lr", lr=0.1)
    out = tmp_path / "out"
    code = main(["compare", a, b, "--repeat", "1", "--output-dir", str(out), "--no-plots"])
    assert code == EXIT_PASS, capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    check_recipe_report(report, "compare", ["slow_lr", "fast_lr"], 1)
    assert set(report["environment"]["recipes"]) == {"slow_lr", "fast_lr"}
    assert not (out / "step_times.png").exists()


def test_run_repeat_writes_a_report(tmp_path, mnist_dir, capsys):
    out = tmp_path / "out"
    code = main(["run", tiny(tmp_path), "--repeat", "2", "--output-dir", str(out), "--quiet",
                 "--no-export"])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    assert printed.count("tiny: PASS") == 2 and "tiny run 2/2" in printed
    report = json.loads((out / "report.json").read_text())
    check_recipe_report(report, "repeat", ["tiny"], 2)
    assert report["comparisons"] == []
    assert_png(out / "loss_curves.png")


@pytest.mark.parametrize("args,message", [
    ([], "compare needs two variants"),
    (["--a", "lrr=0.1", "--b", "lr=0.1"], "did you mean 'lr'"),
    (["--a", "hidden=8", "--b", "lr=0.1"], "'hidden' is FIXED"),
])
def test_compare_input_errors_exit_2(tmp_path, capsys, args, message):
    code = main(["compare", tiny(tmp_path), *args, "--output-dir", str(tmp_path / "o")])
    assert code == EXIT_ERROR
    assert message in capsys.readouterr().err


def test_bench_op_compares_numpy_and_native_relu(tmp_path, capsys):
    out = tmp_path / "op"
    code = main(["bench-op", "Relu", "--shape", "64,128", "--repeat", "8", "--warmup", "1",
                 "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    assert report["kind"] == "op" and report["settings"]["shape"] == [64, 128]
    names = [v["name"] for v in report["variants"]]
    assert names == ["numpy forward", "native forward", "numpy backward", "native backward"]
    assert all(v["time_s"]["n"] == 8 for v in report["variants"])
    assert [c["candidate"] for c in report["comparisons"]] == ["native forward",
                                                               "native backward"]
    assert report["max_abs_diff"] == {"forward": {"native": 0.0}, "backward": {"native": 0.0}}
    assert report["implementations"][0].startswith("numpy = Relu-")
    assert report["implementations"][1].startswith("native = Relu-")
    assert_png(out / "op_times.png")
    assert "forward time native / numpy" in printed and "backward time" in printed


@pytest.mark.parametrize("args,message", [
    (["Reshape", "--shape", "4,4", "--backend", "native"],
     "--backend native: Reshape has no implementation 'native'; it has numpy, planned"),
    (["Relu", "--shape", "4,4", "--backend", "numpy,numpy"], "names one twice"),
    (["Concat"], "bench-op Concat needs --shape"),
    (["Relux", "--shape", "4,4"], "no operator 'Relux' is registered"),
    (["Relu", "--shape", "4,4", "--dtype", "int32"], "dtype int32 is not supported"),
    (["Relu", "--shape", "0,4"], "positive sizes"),
])
def test_bench_op_errors_are_clear(capsys, args, message):
    assert main(["bench-op", *args]) == EXIT_ERROR
    assert message in capsys.readouterr().err


def test_bench_op_reaches_a_users_operator_through_module_and_domain(tmp_path, capsys):
    from meta.lv0.registry import _REGISTRY

    module = tmp_path / "silu_ops.py"
    module.write_text(textwrap.dedent("""
        import numpy as np
        from meta.lv0 import Operator, register

        @register("Silu", domain="test.bench")
        class Silu(Operator):
            def forward(self, ctx, x):
                ctx.save(x=x)
                return x / (1 + np.exp(-x))

            def backward(self, ctx, dy):
                s = 1 / (1 + np.exp(-ctx.x))
                return (dy * s * (1 + ctx.x * (1 - s)),)
    """))
    out = tmp_path / "op"
    try:
        assert main(["bench-op", "Silu", "--shape", "4,4"]) == EXIT_ERROR
        assert "--module FILE" in capsys.readouterr().err  # how to reach yours
        code = main(["bench-op", "Silu", "--domain", "test.bench", "--module", str(module),
                     "--shape", "16,16", "--repeat", "4", "--warmup", "1",
                     "--output-dir", str(out)])
        printed = capsys.readouterr().out
        assert code == EXIT_PASS, printed
        report = json.loads((out / "report.json").read_text())
        assert [v["name"] for v in report["variants"]] == ["numpy forward", "numpy backward"]
        assert report["comparisons"] == [] and report["max_abs_diff"] == {}
        assert "Silu: one implementation (numpy): timed, not compared" in printed
    finally:
        _REGISTRY.pop(("test.bench", "Silu"), None)


def test_bench_op_compares_a_builtin_without_a_cpp_twin_with_the_planned_executor(
        tmp_path, capsys):
    """HardSwish has numpy code and no C++ twin: bench-op compares it with the planned
    executor running it (issue 45), on its one-input default shape; the outputs agree."""
    out = tmp_path / "op"
    # no --threads: in-process it would set this whole test session's threads (the planned
    # BatchNorm precision test, later in the run, then ran on one thread)
    code = main(["bench-op", "HardSwish", "--repeat", "3", "--warmup", "1",
                 "--no-frameworks", "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["shape"] == [64, 4096]
    assert [v["name"] for v in report["variants"]] == [
        "numpy forward", "planned forward", "numpy backward", "planned backward"]
    assert report["implementations"][0].startswith("numpy = HardSwish-14[numpy] (meta.ops.")
    assert report["implementations"][1].startswith(
        "planned = the planned executor on a one-node graph of HardSwish-14 (node runs as ")
    assert report["max_abs_diff"]["forward"]["planned"] < 1e-6
    assert report["max_abs_diff"]["backward"]["planned"] < 1e-5
    # the planned backward includes its forward: no ratio claimed for it
    assert [c["candidate"] for c in report["comparisons"]] == ["planned forward"]
    assert "forward time planned / numpy" in printed
    assert "planned backward: timed with its forward" in printed


def test_bench_op_any_implementation_against_any_other(tmp_path, capsys):
    """--backend picks them and the first is the baseline: planned against native."""
    out = tmp_path / "op"
    code = main(["bench-op", "Relu", "--shape", "8,16", "--repeat", "2", "--warmup", "0",
                 "--backend", "native", "--backend", "planned,numpy", "--no-frameworks",
                 "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    assert [v["name"] for v in report["variants"]][:3] == [
        "native forward", "planned forward", "numpy forward"]
    assert set(report["max_abs_diff"]["forward"]) == {"planned", "numpy"}
    assert "forward time numpy / native" in printed


def test_bench_op_compares_a_users_op_with_the_builtin_of_its_type(tmp_path, capsys):
    """A user's HardSwish in a domain of their own against meta's built-in HardSwish."""
    from meta.lv0.registry import _REGISTRY

    module = tmp_path / "my_ops.py"
    module.write_text(textwrap.dedent("""
        import numpy as np
        from meta.lv0 import Operator, register

        @register("HardSwish", domain="test.mine")
        class MyHardSwish(Operator):
            def forward(self, ctx, x):
                ctx.save(x=x)
                return x * np.clip(x / 6 + 0.5, 0, 1)

            def backward(self, ctx, dy):
                x = ctx.x
                return (dy * np.where(x < -3, 0, np.where(x > 3, 1, x / 3 + 0.5)),)
    """))
    out = tmp_path / "op"
    try:
        code = main(["bench-op", "HardSwish", "--domain", "test.mine", "--module", str(module),
                     "--shape", "16,16", "--repeat", "2", "--warmup", "0", "--no-frameworks",
                     "--output-dir", str(out)])
        printed = capsys.readouterr().out
        assert code == EXIT_PASS, printed
        report = json.loads((out / "report.json").read_text())
        assert [v["name"] for v in report["variants"]][:2] == [
            "numpy forward", "builtin numpy forward"]
        assert report["implementations"][0].startswith(
            "numpy = test.mine::HardSwish-1[numpy] (my_ops.MyHardSwish)")
        assert report["implementations"][1].startswith("builtin numpy = HardSwish-14[numpy]")
        assert report["max_abs_diff"]["forward"]["builtin numpy"] < 1e-6
        assert "forward time builtin numpy / numpy" in printed
    finally:
        _REGISTRY.pop(("test.mine", "HardSwish"), None)


def test_bench_op_draws_labels_and_indices_as_integers(tmp_path, capsys):
    """Inputs ONNX's schema allows only integers for (a loss's labels, Gather's indices) are
    drawn as integers below every size of the first input: random floats there made the
    loss raise a raw IndexError traceback."""
    from meta.bench.opbench import integer_inputs

    assert integer_inputs("SoftmaxCrossEntropyLoss") == {1}
    assert integer_inputs("Gather") == {1} and integer_inputs("Relu") == set()
    out = tmp_path / "op"
    code = main(["bench-op", "SoftmaxCrossEntropyLoss", "--shape", "16,300", "--shape", "16",
                 "--repeat", "3", "--warmup", "1", "--no-frameworks", "--output-dir", str(out)])
    printed = capsys.readouterr().out
    assert code == EXIT_PASS, printed
    report = json.loads((out / "report.json").read_text())
    assert max(report["max_abs_diff"]["forward"].values()) < 1e-5, report["max_abs_diff"]
