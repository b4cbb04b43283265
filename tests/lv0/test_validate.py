"""validate_operator and `meta check-op`: correct ops pass, wrong ones fail, loudly."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from meta.cli import EXIT_ERROR, EXIT_FAIL, EXIT_PASS, main
from meta.lv0 import Operator, register
from meta.lv0.registry import _REGISTRY
from meta.lv0.validate import validate_operator

RNG = np.random.default_rng(0)


def away_from_zero(shape, dtype=np.float64):
    return (RNG.uniform(0.2, 2.0, shape) * RNG.choice([-1, 1], shape)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_a_correct_onnx_op_passes_with_dtype_tolerances(dtype):
    report = validate_operator("Relu", [away_from_zero((3, 4), dtype)])
    assert report.passed, report
    assert report.rtol == {np.float16: 1e-2, np.float32: 1e-4, np.float64: 1e-7}[dtype]
    assert report.gradients is not None and report.gradients.passed
    assert "PASS" in str(report) and "max abs err" in str(report)


def test_attributes_and_several_inputs():
    a, b, c = RNG.standard_normal((3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal(5)
    report = validate_operator("Gemm", [a, b, c], {"transB": 1, "alpha": 0.5}, opset=13)
    assert report.passed and report.opset == 13, report
    assert report.max_abs_error < 1e-12


@pytest.fixture
def custom_ops():
    """A right and a wrong custom op, registered for one test and removed afterwards."""

    @register("GoodSquare", domain="test.validate")
    class GoodSquare(Operator):
        def forward(self, ctx, x):
            ctx.save(x=x)
            return x * x

        def backward(self, ctx, dy):
            return (2 * ctx.x * dy,)

    @register("BadSquare", domain="test.validate")
    class BadSquare(GoodSquare):
        def forward(self, ctx, x):
            ctx.save(x=x)
            return x * x * 1.01  # 1 % off

        def backward(self, ctx, dy):
            return (ctx.x * dy,)  # forgot the 2

    yield GoodSquare, BadSquare
    for name in ("GoodSquare", "BadSquare"):
        _REGISTRY.pop(("test.validate", name))


def square(inputs, attrs):
    return [inputs[0] ** 2]


def test_a_deliberately_wrong_custom_op_fails(custom_ops):
    good, bad = custom_ops
    x = [away_from_zero((4, 3))]
    assert validate_operator(good, x, oracle=square).passed
    report = validate_operator(bad, x, oracle=square)
    assert not report.passed and not report.forward_passed and not report.backward_passed
    text = str(report)
    assert "FAIL" in text and "MISMATCH" in text
    assert report.max_rel_error == pytest.approx(0.01, rel=1e-6)


def test_a_custom_op_needs_an_oracle(custom_ops):
    good, _ = custom_ops
    with pytest.raises(ValueError, match="custom domain 'test.validate'.*oracle"):
        validate_operator(good, [away_from_zero((2,))])
    report = validate_operator(good, [away_from_zero((2,))], check_forward=False)
    assert report.passed and "forward: not checked" in str(report)


def test_forward_errors_and_shape_mismatch_fail(custom_ops):
    good, _ = custom_ops
    report = validate_operator(good, [away_from_zero((2, 2))],
                               oracle=lambda xs, attrs: [np.zeros(3)])
    assert not report.passed and "oracle gives [3]" in str(report)
    report = validate_operator("Gemm", [np.ones((2, 3)), np.ones((2, 3))])
    assert not report.passed and "forward raised" in str(report)


def test_cli_check_op_passes_fails_and_refuses(capsys):
    assert main(["check-op", "Relu", "--shape", "3,4", "--range", "0.2,2"]) == EXIT_PASS
    assert "PASS" in capsys.readouterr().out
    assert main(["check-op", "Gemm", "--shape", "3,4", "--shape", "5,4", "--attr", "transB=1",
                 "--attr", "alpha=0.5", "--dtype", "float64"]) == EXIT_PASS
    assert main(["check-op", "Rellu"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no such operator" in err and "did you mean Relu" in err
    assert main(["check-op", "Relu", "--attr", "alpha=1"]) == EXIT_ERROR
    assert "unknown attribute" in capsys.readouterr().err
    assert main(["check-op", "Relu", "--shape", "2,x"]) == EXIT_ERROR


def test_cli_check_op_on_a_user_module(tmp_path, capsys):
    module = tmp_path / "my_ops.py"
    module.write_text(textwrap.dedent("""
        from meta.lv0 import Operator, register

        @register("WrongCube", domain="test.cli")
        class WrongCube(Operator):
            def forward(self, ctx, x):
                ctx.save(x=x)
                return x ** 3

            def backward(self, ctx, dy):
                return (2 * ctx.x ** 2 * dy,)  # should be 3 x^2

        ORACLES = {"WrongCube": lambda xs, attrs: [xs[0] ** 3]}
    """))
    try:
        code = main(["check-op", "WrongCube", "--domain", "test.cli", "--module", str(module),
                     "--dtype", "float64"])
        out = capsys.readouterr().out
        assert code == EXIT_FAIL, out
        assert "output 0 float64[2, 3]" in out and "MISMATCH" in out and "FAIL" in out
    finally:
        _REGISTRY.pop(("test.cli", "WrongCube"), None)


def test_cli_check_op_names_the_inputs_an_operator_needs(capsys):
    assert main(["check-op", "Conv", "--shape", "2,3"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err == ("meta: error: Conv takes 2 to 3 input(s): x, w, [b]; give one --shape per "
                   "input (1 given)\n")
    assert main(["check-op", "Relu", "--shape", "2,3", "--shape", "2,3"]) == EXIT_ERROR
    assert "Relu takes 1 input(s): x; give one --shape per input (2 given)" in \
        capsys.readouterr().err
    assert main(["check-op", "Sum", "--shape", "2,3", "--shape", "2,3", "--shape",
                 "2,3"]) == EXIT_PASS  # variadic: any number


CUBE = """
    from meta.lv0 import Operator, register

    @register("Cube", domain="test.noforward")
    class Cube(Operator):
        def forward(self, ctx, x):
            ctx.save(x=x)
            return x ** 3

        def backward(self, ctx, dy):
            return (3 * ctx.x ** 2 * dy,)
"""


def test_cli_check_op_without_an_oracle_is_not_a_pass(tmp_path, capsys):
    """Half a check (the backward only) is no PASS unless asked for with --no-forward."""
    module = tmp_path / "cube_ops.py"
    module.write_text(textwrap.dedent(CUBE))
    args = ["check-op", "Cube", "--domain", "test.noforward", "--module", str(module),
            "--dtype", "float64"]
    try:
        assert main(args) == EXIT_FAIL
        out = capsys.readouterr().out
        head = out.splitlines()[0]
        assert head.endswith(": forward not checked") and "PASS" not in head, out
        assert "ORACLES = {'Cube': oracle}" in out and "--no-forward" in out
        assert "backward: gradient check of Cube(): PASS" in out
        assert main([*args, "--no-forward"]) == EXIT_PASS
        out = capsys.readouterr().out
        assert out.splitlines()[0].endswith(": PASS") and "not checked (--no-forward)" in out
    finally:
        _REGISTRY.pop(("test.noforward", "Cube"), None)


def test_cli_check_op_module_errors_are_one_line(tmp_path, capsys):
    assert main(["check-op", "Relu", "--module", str(tmp_path / "missing.py")]) == EXIT_ERROR
    assert capsys.readouterr().err == (f"meta: error: --module {tmp_path / 'missing.py'}: cannot "
                                       f"import it (FileNotFoundError: operator library "
                                       f"'{tmp_path / 'missing.py'}': no such file)\n")
    broken = tmp_path / "broken_ops.py"
    broken.write_text("import no_such_module_here\n")
    assert main(["check-op", "Relu", "--module", str(broken)]) == EXIT_ERROR
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in capsys.readouterr().err


def test_cli_check_op_says_which_implementation_it_checked(capsys):
    """The second line names the registered class; --backend picks the C++ twin, and an
    implementation the op does not have is refused rather than numpy checked instead."""
    assert main(["check-op", "Relu", "--shape", "3,4"]) == EXIT_PASS
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("  implementation checked: Relu-") and "[numpy] (meta.ops." in line
    assert main(["check-op", "Relu", "--shape", "3,4", "--backend", "native"]) == EXIT_PASS
    out = capsys.readouterr().out
    assert "[native] (meta.ops." in out.splitlines()[1] and "PASS" in out.splitlines()[0]
    assert main(["check-op", "HardSwish", "--backend", "native"]) == EXIT_ERROR
    assert capsys.readouterr().err.startswith(
        "meta: error: check-op HardSwish --backend native: HardSwish (opset 14) has no "
        "'native' implementation; it has numpy")
