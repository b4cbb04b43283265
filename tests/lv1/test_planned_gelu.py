"""Gelu (erf) in a planned training step (eltwise.cpp's gelu loop, not oneDNN's eltwise
backward): the forward keeps gelu'(x) when nothing else reads x, else the backward computes
it from x; either way the numpy operator's values and gradients, whether the gradient is
written or added to another contribution, and in the (N, T, C) shape of a transformer's MLP."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def gelu_graph(shape, also_linear: bool, approximate: str = "none"):
    """loss = sum(f * Gelu(h)), h = 1.5 x (+ sum(f * h) when ``also_linear``: h's gradient
    has two contributions, and h is kept for the backward instead of Gelu's derivative)."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("gelu", 20)
    x = b.input("x", np.float32, shape)
    f = b.node("Constant", [], name="f", value=rng.standard_normal(shape).astype(np.float32))
    h = b.node("Mul", [x, b.node("Constant", [], name="s", value=np.float32(1.5))], name="h")
    y = b.node("Gelu", [h], name="gelu", approximate=approximate)
    if also_linear:
        y = b.node("Add", [y, h], name="residual")
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
    # erf Gelu on an input nothing else reads: our loop keeps the derivative
    kept = approximate == "none" and not also_linear
    assert planned.placement()["gelu"] == ("native" if kept else "onednn")
    np.testing.assert_allclose(ours[0]["loss"], ref[0]["loss"], rtol=1e-4, atol=1e-3)
    g, r = ours[1]["x"], ref[1]["x"]
    assert np.abs(g - r).max() <= 2e-6 * max(1.0, np.abs(r).max()), np.abs(g - r).max()
