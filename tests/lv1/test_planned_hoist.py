"""Inference plans compute what depends only on the graph's arrays once, in the prepare program
(``meta.lv1.plan.hoist``): T5's relative position bias, a Gather of a parameter table by
constant bucket indices and its Transpose, no longer runs on every call; it is computed again
when the table changes, a training step keeps it in the forward (and its gradient), and a
random operator is never hoisted."""

from __future__ import annotations

import numpy as np
import pytest

from meta.lv1 import GraphBuilder, PlannedExecutor, ReferenceExecutor
from meta.lv1.plan import runtime

pytestmark = pytest.mark.skipif(not runtime.available(), reason="meta._plan is not built")


def position_bias():
    """scores x (N, 2, 5, 5) + Transpose(Gather(table (4, 2), buckets (5, 5)), (2, 0, 1)):
    T5's bias on its attention scores, and a loss (the sum)."""
    rng = np.random.default_rng(5)
    g = GraphBuilder("bias", 17)
    x = g.input("x", np.float32, ("N", 2, 5, 5))
    table = g.initializer("table", rng.standard_normal((4, 2)).astype(np.float32))
    rel = np.arange(5)[None, :] - np.arange(5)[:, None]
    buckets = g.initializer("buckets", np.clip(rel, -2, 1) + 2)  # int64: a constant
    bias = g.node("Transpose", [g.node("Gather", [table, buckets], name="gather")],
                  name="permute", perm=[2, 0, 1])
    g.node("Add", [x, bias], name="y")
    g.node("ReduceSum", ["y"], name="loss", keepdims=0)
    g.output("y", np.float32, ("N", 2, 5, 5))
    g.output("loss", np.float32, ())
    return g.build(), {"x": rng.standard_normal((3, 2, 5, 5)).astype(np.float32)}


def numpy_bias(graph, x):
    return x + graph.initializers["table"][graph.initializers["buckets"]].transpose(2, 0, 1)


def phases(ex: PlannedExecutor) -> dict[str, str]:
    """Node -> the phase of its first step."""
    found: dict[str, str] = {}
    for s in ex._last.order:
        if s.node in ("gather", "permute", "y"):
            found.setdefault(s.node, s.phase)
    return found


def test_the_bias_is_computed_once_and_again_when_its_table_changes():
    graph, feeds = position_bias()
    ex = PlannedExecutor(graph).eval()
    for _ in range(2):  # the second call runs no prepare program: the bias kept from the first
        np.testing.assert_allclose(ex.inference(feeds, ["y"])["y"], numpy_bias(graph, feeds["x"]),
                                   rtol=1e-6)
    assert phases(ex) == {"gather": "prepare", "permute": "prepare", "y": "forward"}
    graph.initializers["table"][...] *= -2  # written in place, then said: computed again
    graph.touch()
    np.testing.assert_allclose(ex.inference(feeds, ["y"])["y"], numpy_bias(graph, feeds["x"]),
                               rtol=1e-6)
    graph.parameters["table"] = graph.initializers["table"] + 1  # replaced through the API
    np.testing.assert_allclose(ex.inference(feeds, ["y"])["y"], numpy_bias(graph, feeds["x"]),
                               rtol=1e-6)


def test_a_training_step_keeps_the_bias_in_its_forward():
    graph, feeds = position_bias()
    ex = PlannedExecutor(graph).train()
    _, grads = ex.inference_and_backprop(feeds, loss="loss")
    assert phases(ex)["gather"] == "forward"
    _, want = ReferenceExecutor(graph).train().inference_and_backprop(feeds, loss="loss")
    np.testing.assert_allclose(grads["table"], want["table"], rtol=1e-5)


def test_a_random_operator_is_not_hoisted():
    """Dropout of a parameter in a training-mode forward without a backward: new noise on
    every call, though it reads only the graph's arrays."""
    g = GraphBuilder("noise", 17)
    x = g.input("x", np.float32, (4,))
    w = g.initializer("w", np.ones((256,), np.float32))
    g.node("Add", [g.node("Dropout", [w], name="drop"),
                   g.node("ReduceSum", [x], name="s", keepdims=1)], name="y")
    g.output("y", np.float32, (256,))
    ex = PlannedExecutor(g.build()).train()
    feeds = {"x": np.ones(4, np.float32)}
    first, second = (ex.inference(feeds, ["y"])["y"] for _ in range(2))
    assert not np.array_equal(first, second)
