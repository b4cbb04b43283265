"""ConvNeXt's permutes (issue 41): in inference, a Transpose (0, 2, 3, 1) of a channels-last
value and a Transpose (0, 3, 1, 2) back are views (no step); outputs equal the reference
executor's; with a gradient through them they stay steps and the gradients are exact."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def block():
    """x -> depthwise Conv -> permute to NHWC -> LayerNorm -> MatMul -> permute back -> + x."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("convnext_block", 17)
    x = b.input("x", np.float32, (2, 8, 5, 5))
    w = b.initializer("w", rng.standard_normal((8, 1, 3, 3)).astype(np.float32))
    scale = b.initializer("scale", rng.standard_normal(8).astype(np.float32))
    bias = b.initializer("bias", rng.standard_normal(8).astype(np.float32))
    fc = b.initializer("fc", rng.standard_normal((8, 8)).astype(np.float32))
    h = b.node("Conv", [x, w], name="dw", group=8, pads=[1, 1, 1, 1])
    h = b.node("Transpose", [h], name="to_nhwc", perm=[0, 2, 3, 1])
    h = b.node("LayerNormalization", [h, scale, bias], name="norm", axis=-1)
    h = b.node("MatMul", [h, fc], name="mlp")
    h = b.node("Transpose", [h], name="to_nchw", perm=[0, 3, 1, 2])
    b.node("Add", [h, x], name="y")
    b.node("ReduceSum", ["y"], name="loss", keepdims=0)
    b.output("y", np.float32, (2, 8, 5, 5))
    b.output("loss", np.float32, ())
    return b.build(), {"x": rng.standard_normal((2, 8, 5, 5)).astype(np.float32)}


def test_inference_permutes_are_views():
    graph, feeds = block()
    ex = PlannedExecutor(graph).eval()
    got = ex.inference(feeds, ["y"])["y"]
    want = ReferenceExecutor(graph).eval().inference(feeds, ["y"])["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    placement = ex.placement()
    if ex._last.values["dw"].layout == "nhwc":  # the convolution chose channels-last
        assert placement["to_nhwc"] == "view"
    assert placement["to_nchw"] == "view"
    assert not any(s.name == "Transpose" for s in ex._last.order if s.node == "to_nchw")


def test_with_a_gradient_they_stay_steps():
    graph, feeds = block()
    ex = PlannedExecutor(graph).train()
    _, grads = ex.inference_and_backprop(feeds, loss="loss", wrt=["x"])
    _, want = ReferenceExecutor(graph).train().inference_and_backprop(feeds, loss="loss",
                                                                      wrt=["x"])
    assert ex.placement()["to_nchw"] != "view"
    for name in ("w", "fc", "scale", "x"):
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-4, atol=1e-4)
