"""An operator is its (domain, type): a user's operator registered in a domain of its own whose
type clashes with an ONNX operator (HardSwish, Gelu, Relu) runs the user's code on every
executor, never ONNX's kernel (issue 39: the planned executor ran ONNX's HardSwish in place
of a user's, and crashed on a user's Gelu).

Each user operator here computes y = 2x, which no ONNX operator of that name does."""

from __future__ import annotations

import numpy as np
import pytest

import meta.lv1.ort_executor  # noqa: F401  (registers "onnxruntime"; imports it lazily)
import meta.lv1.torch_executor  # noqa: F401  (registers "pytorch"; imports torch lazily)
from meta.lv0 import Operator, register, registry
from meta.lv1 import EXECUTORS, GraphBuilder, GraphError, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

DOMAIN = "my.test"
X = np.array([[-4.0, -1.0, 1.0, 4.0]], np.float32)

needs_plan = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


@pytest.fixture
def twice():
    """y = 2x registered as HardSwish, Gelu and Relu of ``my.test`` (forgotten afterwards)."""
    with registry.scratch():
        for op_type in ("HardSwish", "Gelu", "Relu"):
            @register(op_type, domain=DOMAIN)
            class Twice(Operator):
                def forward(self, ctx, x):
                    return 2 * x

                def backward(self, ctx, dy):
                    return (2 * dy,)
        yield


def graph(op_type: str, *, after_gemm: bool = False):
    """x (-> Gemm) -> the user's ``op_type`` -> y, and loss = sum(y * w): the user op alone, or
    after a Gemm (which the planner would fuse an ONNX activation into)."""
    b = GraphBuilder(f"user_{op_type}")
    x = b.input("x", np.float32, (1, 4))
    h = x
    if after_gemm:
        h = b.node("Gemm", [x, b.initializer("W", np.eye(4, dtype=np.float32))], name="fc")
    y = b.node(op_type, [h], name="user", domain=DOMAIN)
    b.output(y, np.float32, (1, 4))
    w = b.initializer("w", np.arange(1.0, 5.0, dtype=np.float32).reshape(1, 4))
    loss = b.node("ReduceSum", [b.node("Mul", [y, w])], name="loss", keepdims=0)
    b.output(loss, np.float32, ())
    return b.build(), y, loss


@needs_plan
@pytest.mark.parametrize("after_gemm", [False, True])
@pytest.mark.parametrize("op_type", ["HardSwish", "Gelu", "Relu"])
def test_the_planned_executor_runs_the_users_operator(twice, op_type, after_gemm):
    g, y, loss = graph(op_type, after_gemm=after_gemm)
    planned = PlannedExecutor(g)
    out = planned.inference({"x": X}, [y])[y]
    np.testing.assert_array_equal(out, 2 * X)
    assert planned.unplanned is None
    assert planned.placement()["user"] == "python", planned.placement()
    if after_gemm:  # not fused into the Gemm as ONNX's activation would be
        assert not planned.placement()["fc"].startswith("fused"), planned.placement()

    values, grads = planned.inference_and_backprop({"x": X}, loss, wrt=["x"])
    np.testing.assert_allclose(values[loss], np.sum(2 * X * np.arange(1, 5)), rtol=1e-6)
    np.testing.assert_allclose(grads["x"], 2 * np.arange(1.0, 5.0)[None], rtol=1e-6)
    assert planned.placement()["user"] == "python", planned.placement()


@pytest.mark.parametrize("op_type", ["HardSwish", "Gelu", "Relu"])
@pytest.mark.parametrize("name", sorted(EXECUTORS.names()))
def test_every_executor_runs_the_users_operator_or_refuses(twice, op_type, name):
    """Every registered executor computes 2x, or refuses the graph naming the node (one that
    runs only ONNX's domain, as onnxruntime); none runs ONNX's operator of that name."""
    g, y, _ = graph(op_type)
    try:
        executor = EXECUTORS[name].factory(g)
    except ImportError as err:  # an optional executor not installed here
        pytest.skip(f"{name}: {err}")
    except GraphError as err:
        assert "user" in str(err) and DOMAIN in str(err), err
        return
    np.testing.assert_array_equal(executor.inference({"x": X}, [y])[y], 2 * X)
    where = executor.placement().get("user", "")
    assert where in ("python", "numpy", "native", "host"), where  # the operator's own code


@needs_plan
def test_a_user_relu_is_announced_with_its_domain(twice, capsys, monkeypatch):
    from meta.lv1.plan import custom

    monkeypatch.setattr(custom, "_announced", set())
    g, y, _ = graph("Relu")
    PlannedExecutor(g).inference({"x": X}, [y])
    err = capsys.readouterr().err
    assert "Relu (domain my.test), node 'user'" in err and "Python step" in err, err


def test_onnxs_relu_still_gets_its_kernel():
    """The default domain, spelled "" or "ai.onnx", keeps ONNX's kernel."""
    if not runtime.available():
        pytest.skip("meta._plan is not built")
    for domain in ("", "ai.onnx"):
        b = GraphBuilder("onnx_relu")
        x = b.input("x", np.float32, (1, 4))
        y = b.node("Relu", [x], name="relu", domain=domain)
        b.output(y, np.float32, (1, 4))
        planned = PlannedExecutor(b.build())
        np.testing.assert_array_equal(planned.inference({"x": X}, [y])[y], np.maximum(X, 0))
        assert planned.placement()["relu"] == "onednn", planned.placement()
        assert ReferenceExecutor(b.build()).inference({"x": X}, [y])[y].tolist() == \
            np.maximum(X, 0).tolist()
