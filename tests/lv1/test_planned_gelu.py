"""Gelu's backward in the planned executor (eltwise.cpp's gelu loop, not oneDNN's eltwise
backward): the numpy operator's gradient, whether it writes the input's gradient or adds to
another contribution, and in the (N, T, C) shape of a transformer's MLP."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def gelu_graph(shape, also_linear: bool, approximate: str = "none"):
    """loss = sum(f * Gelu(x)) (+ sum(x * f) when ``also_linear``: x's gradient has two
    contributions)."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("gelu", 20)
    x = b.input("x", np.float32, shape)
    f = b.node("Constant", [], name="f", value=rng.standard_normal(shape).astype(np.float32))
    y = b.node("Gelu", [x], name="gelu", approximate=approximate)
    if also_linear:
        y = b.node("Add", [y, x], name="residual")
    b.node("ReduceSum", [b.node("Mul", [y, f], name="weighted")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    return b.build()


@pytest.mark.parametrize("shape", [(7,), (3, 50, 40), (2, 16, 1000)])
@pytest.mark.parametrize("also_linear", [False, True])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient_matches_the_operator(shape, also_linear, approximate):
    graph = gelu_graph(shape, also_linear, approximate)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:3] = [0.0, -12.0, 12.0]
    ref = ReferenceExecutor(graph).train().inference_and_backprop({"x": x}, wrt=["x"])
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop({"x": x}, wrt=["x"])
    assert planned.placement()["gelu"] == "onednn"
    np.testing.assert_allclose(ours[0]["loss"], ref[0]["loss"], rtol=1e-4, atol=1e-3)
    g, r = ours[1]["x"], ref[1]["x"]
    assert np.abs(g - r).max() <= 2e-6 * max(1.0, np.abs(r).max()), np.abs(g - r).max()
