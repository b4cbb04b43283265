"""User operators in the planned executor: a C++ operator is a compiled step (its kernel bound
to the plan's buffers, not the operator's Python entry), a Python one a Python step, and each
is announced once when it leaves the oneDNN kernels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meta.lv0 import Operator, cpp_ops, register, registry
from meta.lv0.cpp_ops import CppOperator, register_cpp_op
from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.layers import Flatten, Linear, Op, Sequential, Silu
from meta.lv1.plan import custom
from tests.lv0.test_cpp_ops import SUM_PRODUCT, SWISH

pytestmark = pytest.mark.slow  # compiling takes 10-30 s of CPU
DOMAIN = "ai.meta.custom"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("meta_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("META_CACHE_DIR", str(folder))
        cpp_ops.build(SWISH)
    return folder


@pytest.fixture
def ops(cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("META_CACHE_DIR", str(cache))
    monkeypatch.setattr(custom, "_announced", set())
    source = tmp_path / "sum_product.cpp"
    source.write_text(SUM_PRODUCT)
    with registry.scratch():
        yield (register_cpp_op("Swish", SWISH, attributes={"beta": 1.0}),
               register_cpp_op("SumProduct", source, attributes={"alpha": 2.0}))


def swish_mlp(dtype=np.float32):
    return Sequential(Flatten(), Linear(16), Op("Swish", domain=DOMAIN, beta=1.5), Linear(3)
                      ).graph((2, 4), seed=0, dtype=dtype)


def test_a_cpp_op_is_a_compiled_step_and_computes_the_reference(ops, capsys):
    graph = swish_mlp()
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((5, 2, 4)).astype(np.float32),
             "labels": rng.integers(0, 3, 5)}
    expected = ReferenceExecutor(graph).inference_and_backprop(feeds, wrt=["input"])

    planned = PlannedExecutor(graph)
    planned.inference_and_backprop(feeds, wrt=["input"])  # compiles (its trace runs forward)

    def not_called(*args, **kwargs):
        raise AssertionError("the plan went through the operator's Python entry")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CppOperator, "forward", not_called)
        mp.setattr(CppOperator, "backward", not_called)
        values, grads = planned.inference_and_backprop(feeds, wrt=["input"])
    assert planned.placement()["swish1"] == "compiled"
    np.testing.assert_allclose(values["loss"], expected[0]["loss"], rtol=1e-5)
    for key, g in expected[1].items():
        np.testing.assert_allclose(grads[key], g, rtol=1e-4, atol=1e-6, err_msg=key)
    assert planned.plan_summary().startswith("nodes: {") and "'compiled': 1" in \
        planned.plan_summary()
    for _ in range(2):  # announced once, with the op's name
        planned.inference_and_backprop(feeds)
        PlannedExecutor(graph).inference(feeds)
    err = capsys.readouterr().err
    assert err.count("Swish (domain ai.meta.custom), node 'swish1', leaves the oneDNN kernels: "
                     "a compiled C++ step") == 1, err


def test_float64_and_an_inference_plan(ops):
    graph = swish_mlp(np.float64)
    x = np.random.default_rng(1).standard_normal((3, 2, 4))
    planned = PlannedExecutor(graph)
    out = planned.inference({"input": x}, ["logits"])["logits"]
    assert planned.placement()["swish1"] == "compiled"
    np.testing.assert_allclose(out, ReferenceExecutor(graph).inference(
        {"input": x}, ["logits"])["logits"], rtol=1e-12)


def test_several_outputs_one_unused_and_a_gradient_that_adds_up(ops):
    """SumProduct's output p feeds the loss, s nothing (its gradient: zeros); input a is read
    twice (its gradient adds up across the compiled step and the Mul); w is a fed 0-d input."""
    b = GraphBuilder("sp")
    a = b.input("a", np.float32, (3, 4))
    bb = b.input("b", np.float32, (3, 4))
    w = b.input("w", np.float32, ())
    s, p = b.node("SumProduct", [a, bb, w], n_outputs=2, name="sp", domain=DOMAIN, alpha=3.0)
    m = b.node("Mul", [p, a], name="mul")
    loss = b.node("ReduceSum", [m], name="loss", keepdims=0)
    b.output(loss, np.float32, ())
    b.output(s, np.float32, (3, 4))
    graph = b.build()
    rng = np.random.default_rng(2)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal((3, 4)).astype(np.float32),
             "w": np.array(0.7, np.float32)}
    planned = PlannedExecutor(graph)
    values, grads = planned.inference_and_backprop(feeds, outputs=["sp_out0"],
                                                   wrt=["a", "b", "w"])
    ref_values, ref_grads = ReferenceExecutor(graph).inference_and_backprop(
        feeds, outputs=["sp_out0"], wrt=["a", "b", "w"])
    assert planned.placement()["sp"] == "compiled"
    np.testing.assert_allclose(values["sp_out0"], ref_values["sp_out0"], rtol=1e-6)
    for key in ("a", "b", "w"):
        np.testing.assert_allclose(grads[key], ref_grads[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)


def test_a_python_op_is_a_python_step_and_says_so_once(ops, capsys):
    class Cube(Operator):
        def forward(self, ctx, x):
            ctx.save(x=x)
            return x ** 3

        def backward(self, ctx, dy):
            return (3 * ctx.x ** 2 * dy,)
    register("Cube", domain="user")(Cube)
    graph = Sequential(Flatten(), Linear(6), Op("Cube", domain="user"), Silu(), Linear(3)
                       ).graph((4,), seed=0)
    feeds = {"input": np.ones((2, 4), np.float32), "labels": np.array([0, 1])}
    planned = PlannedExecutor(graph)
    planned.inference_and_backprop(feeds)
    planned.inference(feeds)
    where = planned.placement()
    assert where["cube1"] == "python"
    assert where["silu1.sigmoid"] != "python" and where["silu1"] != "python"  # built-in kernels
    err = capsys.readouterr().err
    assert err.count("Cube (domain user), node 'cube1', leaves the oneDNN kernels: a Python "
                     "step") == 1, err
