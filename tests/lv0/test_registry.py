from __future__ import annotations

import numpy as np
import pytest

from meta.lv0 import (
    Context,
    GradCheckReport,
    Operator,
    UnknownOperatorError,
    check_gradients,
    lookup,
    register,
    registry,
)
from meta.lv0.broadcast import unbroadcast


@pytest.fixture
def scratch_registry():
    with registry.scratch():
        yield


def test_lookup_picks_newest_version_not_above_opset(scratch_registry):
    @register("Twice", since=1, domain="test")
    class V1(Operator):
        pass

    @register("Twice", since=9, domain="test")
    class V9(Operator):
        pass

    assert lookup("Twice", 8, "test") is V1
    assert lookup("Twice", 9, "test") is V9
    assert lookup("Twice", 21, "test") is V9
    assert V9.op_type == "Twice" and V9.domain == "test" and V9.since == 9


def test_lookup_errors_name_op_domain_and_opset(scratch_registry):
    with pytest.raises(UnknownOperatorError, match=r"'NoSuchOp'.*domain 'ai.onnx'.*opset 17"):
        lookup("NoSuchOp", 17)

    @register("Late", since=15, domain="test")
    class Late(Operator):
        pass

    with pytest.raises(UnknownOperatorError, match="only from opset 15"):
        lookup("Late", 13, "test")


def test_backend_preference_falls_back_to_numpy():
    from meta.ops.relu import NativeRelu, Relu
    from meta.ops.reshape import Reshape

    assert lookup("Relu", 17, backends=("native",)) is NativeRelu
    assert lookup("Relu", 17) is Relu
    assert lookup("Reshape", 17, backends=("native",)) is Reshape  # no twin: numpy


def test_duplicate_registration_is_refused(scratch_registry):
    @register("Dup", domain="test")
    class A(Operator):
        pass

    with pytest.raises(ValueError, match="already registered"):
        @register("Dup", domain="test")
        class B(Operator):
            pass


def test_unknown_attribute_is_named():
    from meta.ops.gemm import Gemm

    with pytest.raises(TypeError, match=r"Gemm: unknown attribute\(s\) transC"):
        Gemm(transC=1)


def test_gradcheck_catches_a_wrong_backward():
    class WrongSquare(Operator):
        op_type = "WrongSquare"

        def forward(self, ctx, x):
            ctx.save(x=x)
            return x * x

        def backward(self, ctx, dy):
            return (ctx.x * dy,)  # missing the factor 2

    report = check_gradients(WrongSquare(), [np.array([1.0, -2.0, 3.0])])
    assert isinstance(report, GradCheckReport) and not report.passed
    assert "MISMATCH" in str(report)


def test_gradcheck_requires_none_for_integer_inputs():
    class LeakyIndex(Operator):
        op_type = "LeakyIndex"

        def forward(self, ctx, x, i):
            return x[i]

        def backward(self, ctx, dy):
            return (np.zeros(3), np.zeros(1))  # a gradient for the index: wrong

    report = check_gradients(LeakyIndex(), [np.ones(3), np.array([1])])
    assert not report.passed and "non-differentiable" in str(report)


def test_context_needs():
    assert Context().needs(3)
    ctx = Context([True, False])
    assert ctx.needs(0) and not ctx.needs(1) and not ctx.needs(2)


@pytest.mark.parametrize("shape,axes", [((3,), 0), ((1, 3), 0), ((4, 1), 1), ((1,), None),
                                        ((), None), ((4, 3), ())])
def test_unbroadcast_sums_broadcast_axes(shape, axes):
    grad = np.random.default_rng(0).standard_normal((4, 3))
    expected = grad.sum(axis=axes).reshape(shape)
    np.testing.assert_allclose(unbroadcast(grad, shape), expected)


def test_unbroadcast_rejects_a_larger_target():
    with pytest.raises(ValueError, match=r"\(3,\) to \(2, 3\)"):
        unbroadcast(np.ones(3), (2, 3))


def test_unregister(scratch_registry):
    @register("Temp", since=3, domain="test")
    class Temp(Operator):
        pass

    assert lookup("Temp", 5, "test") is Temp
    from meta.lv0 import unregister

    unregister("Temp", since=3, domain="test")
    with pytest.raises(UnknownOperatorError):
        lookup("Temp", 5, "test")
    with pytest.raises(KeyError, match="'Temp'.*not registered"):
        unregister("Temp", since=3, domain="test")


def _registrations() -> list:
    from meta.lv0 import entries

    return [(e.domain, e.op_type, e.since, e.backend, e.cls) for e in entries()]


@pytest.mark.parametrize("domain, since, backend", [
    ("", 6, "numpy"),       # the built-in's own slot
    ("", 14, "numpy"),      # a newer opset would shadow the built-in from there on
    ("ai.onnx", 6, "numpy"),  # ONNX's other spelling of the default domain
    ("", 6, "mine"),        # a backend of its own under the built-in's name
])
def test_a_builtin_name_is_refused_before_anything_changes(domain, since, backend):
    from meta.ops.relu import Relu

    before = _registrations()
    with pytest.raises(ValueError, match=r"^operator 'Relu' \(domain 'ai.onnx'\) is built in "
                                         r"\(meta\.ops\.relu\.Relu\); register yours under a "
                                         r"domain"):
        @register("Relu", since=since, domain=domain, backend=backend)
        class MyRelu(Operator):
            pass

    assert _registrations() == before
    assert lookup("Relu", 21) is Relu and lookup("Relu", 6, "ai.onnx") is Relu


def test_the_same_name_in_a_domain_of_ones_own_is_fine(scratch_registry):
    @register("Relu", domain="my.ops")
    class MyRelu(Operator):
        pass

    assert lookup("Relu", 1, "my.ops") is MyRelu
    from meta.ops.relu import Relu

    assert lookup("Relu", 21) is Relu


def test_a_builtin_name_is_refused_before_the_library_is_loaded(tmp_path):
    # In a fresh process the library loads lazily: a user's op registered first used to be
    # accepted, and loading the library later failed halfway, leaving every op after 'relu'
    # (in file order) unregistered for the rest of the process.
    import subprocess
    import sys

    script = tmp_path / "user_relu.py"
    script.write_text(
        "from meta.lv0 import Operator, lookup, register\n"
        "try:\n"
        "    @register('Relu', since=6)\n"
        "    class MyRelu(Operator):\n"
        "        pass\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
        "for op in ('Relu', 'Sigmoid', 'Softmax', 'Tanh', 'Gemm'):\n"
        "    print(op, lookup(op, 17).__module__)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "refused: operator 'Relu' (domain 'ai.onnx') is built in" in out
    for op, module in [("Relu", "meta.ops.relu"), ("Sigmoid", "meta.ops.sigmoid"),
                       ("Tanh", "meta.ops.tanh"), ("Softmax", "meta.ops.softmax"),
                       ("Gemm", "meta.ops.gemm")]:
        assert f"{op} {module}" in out


def test_load_library_takes_a_python_file_once(tmp_path):
    from meta.lv0 import load_library

    (tmp_path / "helpers_for_lib.py").write_text("SCALE = 2\n")
    lib = tmp_path / "lib_ops.py"
    lib.write_text(
        "from helpers_for_lib import SCALE\n"  # its folder is importable while it loads
        "from meta.lv0 import Operator, register\n"
        "LOADS = [1]\n"
        "@register('Twice', domain='test.lib')\n"
        "class Twice(Operator):\n"
        "    def forward(self, ctx, x):\n"
        "        return SCALE * x\n")
    with registry.scratch():
        module = load_library(str(lib))
        assert lookup("Twice", 1, "test.lib").__module__ == module.__name__ == "lib_ops"
        assert load_library(str(lib)) is module and module.LOADS == [1]
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_library(str(tmp_path / "absent.py"))
