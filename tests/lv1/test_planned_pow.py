"""Pow by a constant scalar and Reciprocal in a planned training step: oneDNN's pow
(alpha * x^beta) forward and backward, not a Python step. GPT-2's tanh-approximated GELU
exports ``Pow(x, 3)``, which as a Python step took 92 % of that model's inference; RMSNorm's
expanded form exports ``Pow(x, 2)``. A tensor exponent stays the operator's."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")

SHAPE = (4, 16, 33)


def gelu_tanh_graph(exponent, reciprocal=False, dtype=np.float32):
    """GPT-2's GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^p))), summed against f (and
    through 1 / (2 + x^2) when ``reciprocal``)."""
    rng = np.random.default_rng(1)
    b = GraphBuilder("gelu_pow", 20)
    x = b.input("x", np.float32, SHAPE)

    def const(name, value):
        return b.node("Constant", [], name=name, value=np.asarray(value))

    p = b.node("Pow", [x, const("p", np.asarray(exponent, dtype))], name="pow")
    inner = b.node("Mul", [b.node("Add", [x, b.node("Mul", [p, const("k", np.float32(0.044715))],
                                                    name="kp")], name="sum"),
                           const("c", np.float32(np.sqrt(2 / np.pi)))], name="scaled")
    t = b.node("Tanh", [inner], name="tanh")
    y = b.node("Mul", [b.node("Mul", [x, const("half", np.float32(0.5))], name="hx"),
                       b.node("Add", [t, const("one", np.float32(1))], name="t1")], name="gelu")
    if reciprocal:
        sq = b.node("Mul", [x, x], name="sq")
        r = b.node("Reciprocal", [b.node("Add", [sq, const("two", np.float32(2))], name="d")],
                   name="recip")
        y = b.node("Add", [y, r], name="plus")
    f = const("f", rng.standard_normal(SHAPE).astype(np.float32))
    b.node("ReduceSum", [b.node("Mul", [y, f], name="weighted")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    return b.build()


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("exponent,dtype", [(3, np.float32), (2, np.float32), (3, np.int64),
                                            (1.5, np.float32)])
def test_pow_by_a_constant_runs_in_the_plan_forward_and_backward(exponent, dtype, fuse,
                                                                 monkeypatch):
    """oneDNN's pow with pointwise groups off; with them on, in the group's fused step."""
    from meta.lv1.plan.lowering import fused

    monkeypatch.setattr(fused, "ENABLED", fuse)
    graph = gelu_tanh_graph(exponent, reciprocal=True, dtype=dtype)
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    if exponent == 1.5:
        x = np.abs(x) + 0.1  # a fractional power of a negative number is NaN on both
    ref = ReferenceExecutor(graph).train().inference_and_backprop({"x": x}, wrt=["x"])
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop({"x": x}, wrt=["x"])
    place = planned.placement()
    if fuse:
        assert place["pow"].startswith("fused into") and place["recip"].startswith("fused into")
    else:
        assert place["pow"] == "onednn" and place["recip"] == "onednn", place
    np.testing.assert_allclose(ours[0]["loss"], ref[0]["loss"], rtol=1e-5, atol=1e-3)
    g, r = ours[1]["x"], ref[1]["x"]
    assert np.abs(g - r).max() <= 1e-5 * max(1.0, np.abs(r).max()), np.abs(g - r).max()


def test_a_tensor_exponent_stays_the_operators():
    b = GraphBuilder("pow_tensor", 20)
    x, e = b.input("x", np.float32, (3, 4)), b.input("e", np.float32, (3, 4))
    b.node("ReduceSum", [b.node("Pow", [x, e], name="pow")], name="loss", keepdims=0)
    b.output("loss", np.float32, ())
    graph = b.build()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.uniform(0.5, 2, (3, 4)).astype(np.float32),
             "e": rng.uniform(-1, 2, (3, 4)).astype(np.float32)}
    planned = PlannedExecutor(graph).train()
    ours = planned.inference_and_backprop(feeds, wrt=["x", "e"])
    ref = ReferenceExecutor(graph).train().inference_and_backprop(feeds, wrt=["x", "e"])
    assert planned.placement()["pow"] != "onednn"
    for name in ("x", "e"):
        np.testing.assert_allclose(ours[1][name], ref[1][name], rtol=1e-5)
